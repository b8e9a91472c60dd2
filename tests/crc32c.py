"""CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), table-driven, written from the definition:
the independent reference the tests check Tessera's checkpoint files and TensorBoard records with.
Imported by tests/fuzz/make_seeds.py and tests/unit/tensorboard.sh (not a test itself)."""

TABLE = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    TABLE.append(c)


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the published check value
