"""AEGIS operator CLI: the ``aegis`` command and the commands it is built from."""
