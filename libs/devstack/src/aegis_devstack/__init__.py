"""AEGIS development stack: local servers, the emulator, ``aegis up`` and the test fixtures."""
