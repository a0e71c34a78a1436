/* Declarations cffi exposes to Python (parsed by cffi: no preprocessor logic here). */
uint32_t rj_abi_version(void);
