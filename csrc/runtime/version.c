#include "rj_api.h"

uint32_t rj_abi_version(void) { return RJ_ABI_VERSION; }
