// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of every checkpoint file.
// Same function as iSCSI / ext4 / Google's crc32c: crc32c("123456789") == 0xE3069283.
// Uses the SSE4.2 crc32 instruction when the CPU has it, else slicing-by-8 tables; both give the
// same result (tested).
#pragma once
#include <cstddef>
#include <cstdint>

namespace tessera::checkpoint {

// Continues a running checksum: crc32c(b, crc32c(a)) == crc32c(a + b). Start with crc = 0.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// The portable table-driven implementation (exposed for tests).
uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc = 0);
// True if crc32c() uses the hardware instruction on this CPU.
bool crc32c_hardware();

}  // namespace tessera::checkpoint
