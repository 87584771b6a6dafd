/* A stand-in for Windows' bcryptprimitives.dll, for running the Windows host under Wine 8.0
 * only (real Windows has the DLL; Wine 8.0 does not). Rust's standard library imports
 * ProcessPrng from it; this fills the buffer through advapi32's RtlGenRandom. Built by
 * tests/wheel_smoke.py next to its unpacked copy of the executable, never shipped. */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length)
{
    while (length > 0) {
        ULONG chunk = length > 0x40000000 ? 0x40000000 : (ULONG)length;
        if (!SystemFunction036(data, chunk)) {
            return FALSE;
        }
        data += chunk;
        length -= chunk;
    }
    return TRUE;
}
