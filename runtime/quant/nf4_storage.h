// QLoRA's frozen base: NF4 as the storage of the engine's frozen groups (fsdp::FrozenStorage). Each
// rank's chunk of a unit's frozen group is one self-contained NF4 segment (nf4.h: packed codes, then
// the block scales), so the all-gather moves bytes, never floats, and every rank decodes the W
// segments into the compute dtype when the unit is gathered, in forward and in backward.
//
// Blocks: the engine aligns every chunk and every parameter's offset to 64 elements (align()), so a
// block never straddles two weights and each weight's blocks are its own flattened 64-element runs,
// as bitsandbytes quantizes it; a weight whose size is not a multiple of 64 is padded with zeros in
// its last block (the flat buffer's padding), never refused. Without double quantization the blocks
// are the same at every world size; with it, the second-level groups of 256 scales restart at each
// rank's segment (a rank's scales are quantized among themselves).
#pragma once
#include "runtime/fsdp/fsdp.h"

namespace tessera::quant {

// lora.base_dtype=nf4 (double_quant: lora.double_quant).
std::shared_ptr<const fsdp::FrozenStorage> nf4_storage(bool double_quant);

}  // namespace tessera::quant
