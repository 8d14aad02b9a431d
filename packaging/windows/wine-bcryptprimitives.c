/* For packaging/test-msi.sh only: Wine 8 (Debian 12) has no
 * bcryptprimitives.dll, whose ProcessPrng the Rust standard library calls
 * for random bytes on Windows 10 and later. This stand-in, copied into the
 * test's Wine prefix, answers it with RtlGenRandom (advapi32's
 * SystemFunction036), which Wine has. Windows itself needs nothing: the
 * MSI installs no such file. */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length)
{
    while (length > 0) {
        ULONG chunk = length > 0x40000000 ? 0x40000000 : (ULONG)length;
        if (!SystemFunction036(data, chunk))
            return FALSE;
        data += chunk;
        length -= chunk;
    }
    return TRUE;
}
