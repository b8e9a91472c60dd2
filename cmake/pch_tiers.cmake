# Precompiled headers in three tiers (included by the top CMakeLists.txt).
#
# A precompiled <torch/torch.h> saves a source that parses it about 9 s (GCC 12, LibTorch 1.13,
# -O2 -g1), but loading it (a 641 MB .gch) costs every source about 5 s, even one that uses none of
# it: with it on all 96 sources, half of the binary's build was spent loading it. So each source
# gets the smallest precompiled header that covers what it includes, itself or through the
# project's headers (followed to any depth):
#   torch: <torch/torch.h>                                          -> tessera_pch      (cmake/pch.h)
#   aten:  any other LibTorch header (<ATen/..>, <c10/..>, <torch/..>)
#          or nlohmann-json                                         -> tessera_pch_aten (cmake/pch_aten.h, 300 MB, ~1.5 s to load)
#   plain: none of these                                            -> none
# Only the build's speed depends on the tier; every source includes what it uses.
#
# Unity units: what a translation unit that includes LibTorch costs gcc before its own code (the
# precompiled header, the same templates instantiated and optimised again) is paid once per unit of
# TESSERA_UNITY sources (CMake's UNITY_BUILD; 0: a unit per source), in every library part and test
# binary (measurements: docs/PERFORMANCE.md#build-suite-and-start-up-measurements). The sources of one part share a unit, so the names they define at file scope (also
# in anonymous namespaces) must differ; a source that forgets an include may compile only in its unit
# (-DTESSERA_UNITY=0 shows it).

# Flags for code that is only checked, never timed (the test files, the NCCL link check of a CPU
# build): -O1 without debug information. -O1 keeps __OPTIMIZE__ defined, so the -O2 precompiled
# headers above still load (-O0 would not), and a header built with -g1 serves a compile without
# -g (measurements: docs/PERFORMANCE.md#build-suite-and-start-up-measurements).
set(TESSERA_CHECK_ONLY_OPT -O1 -g0)

# tessera_include_tier(FILE OUT): 2 (torch), 1 (aten) or 0 (plain) for FILE, cached per file.
function(tessera_include_tier file out)
  string(MD5 key "${file}")
  get_property(cached GLOBAL PROPERTY TESSERA_TIER_${key} SET)
  if(cached)
    get_property(tier GLOBAL PROPERTY TESSERA_TIER_${key})
    set(${out} ${tier} PARENT_SCOPE)
    return()
  endif()
  set_property(GLOBAL PROPERTY TESSERA_TIER_${key} 0)  # an include cycle reads 0 while in progress
  set(tier 0)
  get_filename_component(dir ${file} DIRECTORY)
  file(STRINGS ${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]")
  foreach(line IN LISTS lines)
    if(line MATCHES "<torch/torch\\.h>")
      set(tier 2)
      break()
    elseif(line MATCHES "<(ATen|c10|torch)/|<nlohmann/json")
      set(tier 1)
    elseif(line MATCHES "\"([^\"]+)\"")
      set(h ${CMAKE_SOURCE_DIR}/${CMAKE_MATCH_1})
      if(NOT EXISTS ${h})
        set(h ${dir}/${CMAKE_MATCH_1})
      endif()
      if(EXISTS ${h})
        tessera_include_tier(${h} sub)
        if(sub GREATER tier)
          set(tier ${sub})
        endif()
        if(tier EQUAL 2)
          break()
        endif()
      endif()
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY TESSERA_TIER_${key} ${tier})
  set(${out} ${tier} PARENT_SCOPE)
endfunction()

# tessera_pch_for(TARGET TIER): TARGET's sources use that tier's precompiled header.
function(tessera_pch_for tgt tier)
  target_compile_options(${tgt} PRIVATE -Wall -Wno-unused-parameter -Wno-sign-compare)
  if(tier EQUAL 2)
    target_precompile_headers(${tgt} REUSE_FROM tessera_pch)
  elseif(tier EQUAL 1)
    target_precompile_headers(${tgt} REUSE_FROM tessera_pch_aten)
  endif()
endfunction()

# tessera_use_pch(TARGET): a target of one source (an executable, a test) gets that source's tier;
# a target of several gets the torch tier.
function(tessera_use_pch tgt)
  get_target_property(srcs ${tgt} SOURCES)
  list(LENGTH srcs n)
  set(tier 2)
  if(n EQUAL 1)
    get_filename_component(src ${srcs} ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
    tessera_include_tier(${src} tier)
  endif()
  tessera_pch_for(${tgt} ${tier})
endfunction()

# tessera_unity(TARGET): TARGET's sources compile TESSERA_UNITY to a translation unit.
function(tessera_unity tgt)
  if(TESSERA_UNITY GREATER 0)
    set_target_properties(${tgt} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${TESSERA_UNITY})
  endif()
endfunction()

# tessera_add_tier_parts(TARGET SOURCES src... LINK <scope> lib... [INCLUDES dir...]
#                        [COMPILE_OPTIONS opt...] [ONE_UNIT]): TARGET's sources compile in one OBJECT library
# per tier (TARGET_torch, TARGET_aten, TARGET_plain, those that have sources), each with that
# tier's precompiled header, in unity units, linked with LINK, with INCLUDES as private include
# directories and COMPILE_OPTIONS as private options; TARGET holds their objects. Used for the libraries
# (below) and the test binaries (tests/CMakeLists.txt). ONE_UNIT: when all the sources fit in one
# unity unit (TESSERA_UNITY or fewer), they compile as one part of the highest tier among them: one
# translation unit, where a part per tier would pay a unit's fixed cost two or three times (a small
# library: a runtime/ folder).
function(tessera_add_tier_parts target)
  cmake_parse_arguments(P "ONE_UNIT" "" "SOURCES;LINK;INCLUDES;COMPILE_OPTIONS" ${ARGN})
  set(tier_names plain aten torch)
  list(LENGTH P_SOURCES n)
  set(merge OFF)
  if(P_ONE_UNIT AND TESSERA_UNITY GREATER 0 AND NOT n GREATER TESSERA_UNITY)
    set(merge ON)
    set(top 0)
    foreach(src IN LISTS P_SOURCES)
      tessera_include_tier(${src} t)
      if(t GREATER top)
        set(top ${t})
      endif()
    endforeach()
  endif()
  foreach(tier 2 1 0)
    set(srcs)
    foreach(src IN LISTS P_SOURCES)
      tessera_include_tier(${src} t)
      if(merge)
        set(t ${top})
      endif()
      if(t EQUAL tier)
        list(APPEND srcs ${src})
      endif()
    endforeach()
    if(NOT srcs)
      continue()
    endif()
    list(GET tier_names ${tier} tier_name)
    set(part ${target}_${tier_name})
    add_library(${part} OBJECT ${srcs})
    target_include_directories(${part} PRIVATE ${P_INCLUDES})
    target_compile_options(${part} PRIVATE ${P_COMPILE_OPTIONS})
    target_link_libraries(${part} ${P_LINK})
    tessera_pch_for(${part} ${tier})
    tessera_unity(${part})
    target_sources(${target} PRIVATE $<TARGET_OBJECTS:${part}>)
  endforeach()
endfunction()

# tessera_add_library(NAME ROOT dir SOURCES src... LIBS lib... [PRIVATE_INCLUDES dir...]): the STATIC
# library NAME of one layer, its sources in parts per tier (tessera_add_tier_parts, ONE_UNIT), ROOT
# its include root (its layer's folder of links, cmake/layers.cmake). What NAME's sources and users
# need (ROOT, LIBS) is the INTERFACE library NAME_usage, which NAME and every part link: a dependency
# added to it later reaches them all.
function(tessera_add_library name)
  cmake_parse_arguments(L "" "ROOT" "SOURCES;LIBS;PRIVATE_INCLUDES" ${ARGN})
  if(NOT L_ROOT)
    message(FATAL_ERROR "tessera_add_library(${name}): no ROOT (its layer's include root, cmake/layers.cmake)")
  endif()
  add_library(${name}_usage INTERFACE)
  target_include_directories(${name}_usage INTERFACE ${L_ROOT})
  target_link_libraries(${name}_usage INTERFACE ${L_LIBS})
  add_library(${name} STATIC)
  target_link_libraries(${name} PUBLIC ${name}_usage)
  tessera_add_tier_parts(${name} ONE_UNIT SOURCES ${L_SOURCES} LINK PUBLIC ${name}_usage INCLUDES ${L_PRIVATE_INCLUDES})
endfunction()
