# Sourced by scripts/compat.sh and scripts/torch26_headers.sh (not run by itself).
# mirror: the first Debian URI of this system's apt sources (deb822 or one-line format), else
# deb.debian.org: Debian 13's packages come from the same registry under another suite name.
mirror() {
  local u
  u=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
      grep -oE 'https?://[^ ]*/debian/?' | grep -v security | head -1 || true)
  echo "${u:-http://deb.debian.org/debian}"
}
