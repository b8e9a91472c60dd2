# The layers, bottom first (docs/ARCHITECTURE.md#layers), held by the compiler: a layer includes only
# itself and the layers below it. Each layer's library (and each runtime/ folder's) compiles with
# build/layers/<name>/ as its one include root, never the source tree: a folder of symbolic links to
# the folders it may include and no others. An #include that points up the order finds no file
# ("fatal error: text/tokenizer.h: No such file or directory"). The libraries link in the same order
# (tessera_layer_library). tests/unit/architecture.sh compiles a wrong-way include for every pair of
# layers against these roots, and checks that every library's compile uses its own root alone.
set(TESSERA_LAYERS util text model runtime tools launcher benchmarks app)
# runtime/ is a layer of folders, in their own order: each includes only the ones before it.
# gpu/ is the one home of CUDA code (runtime/gpu/gpu.h): above what it implements (comm's seam,
# profile's clock), below every folder that asks it.
set(TESSERA_RUNTIME_FOLDERS data memory comm profile gpu device optim fsdp quant checkpoint planner train generate)

file(GLOB _runtime_entries LIST_DIRECTORIES true RELATIVE ${CMAKE_SOURCE_DIR}/runtime ${CMAKE_SOURCE_DIR}/runtime/*)
foreach(_e ${_runtime_entries})
  if(IS_DIRECTORY ${CMAKE_SOURCE_DIR}/runtime/${_e} AND NOT _e IN_LIST TESSERA_RUNTIME_FOLDERS)
    message(FATAL_ERROR "runtime/${_e}/ has no place in the layer order: add it to TESSERA_RUNTIME_FOLDERS (cmake/layers.cmake)")
  endif()
endforeach()

# tessera_layer_root(NAME LAYER [RUNTIME_UPTO FOLDER]): writes build/layers/NAME/ (anew each configure)
# with links to the folders of the layers up to LAYER; for LAYER runtime with RUNTIME_UPTO, runtime/
# is a folder of its own holding runtime/'s top-level headers and the runtime folders up to FOLDER.
# Sets TESSERA_ROOT_<NAME> to the folder.
function(tessera_layer_root name layer)
  cmake_parse_arguments(R "" "RUNTIME_UPTO" "" ${ARGN})
  set(root ${CMAKE_BINARY_DIR}/layers/${name})
  file(REMOVE_RECURSE ${root})
  file(MAKE_DIRECTORY ${root})
  foreach(l IN LISTS TESSERA_LAYERS)
    if(l STREQUAL "runtime" AND R_RUNTIME_UPTO)
      file(MAKE_DIRECTORY ${root}/runtime)
      file(GLOB headers RELATIVE ${CMAKE_SOURCE_DIR}/runtime ${CMAKE_SOURCE_DIR}/runtime/*.h)
      foreach(h ${headers})
        file(CREATE_LINK ${CMAKE_SOURCE_DIR}/runtime/${h} ${root}/runtime/${h} SYMBOLIC)
      endforeach()
      foreach(f IN LISTS TESSERA_RUNTIME_FOLDERS)
        file(CREATE_LINK ${CMAKE_SOURCE_DIR}/runtime/${f} ${root}/runtime/${f} SYMBOLIC)
        if(f STREQUAL R_RUNTIME_UPTO)
          break()
        endif()
      endforeach()
    elseif(EXISTS ${CMAKE_SOURCE_DIR}/${l})
      file(CREATE_LINK ${CMAKE_SOURCE_DIR}/${l} ${root}/${l} SYMBOLIC)
    endif()
    if(l STREQUAL layer)
      break()
    endif()
  endforeach()
  set(TESSERA_ROOT_${name} ${root} PARENT_SCOPE)
endfunction()

foreach(_l IN LISTS TESSERA_LAYERS)
  tessera_layer_root(${_l} ${_l})
endforeach()
foreach(_f IN LISTS TESSERA_RUNTIME_FOLDERS)
  tessera_layer_root(runtime_${_f} runtime RUNTIME_UPTO ${_f})
endforeach()
# What the architecture test reads: the roots, bottom first, one "name layer-folder" a line.
set(_order)
foreach(_l util text model)
  list(APPEND _order "${_l} ${_l}")
endforeach()
foreach(_f IN LISTS TESSERA_RUNTIME_FOLDERS)
  list(APPEND _order "runtime_${_f} runtime/${_f}")
endforeach()
foreach(_l tools launcher benchmarks app)
  list(APPEND _order "${_l} ${_l}")
endforeach()
list(JOIN _order "\n" _order)
file(WRITE ${CMAKE_BINARY_DIR}/layers/order.txt "${_order}\n")
