"""Facts about the machine, read from outside the process: the device, its memory, the installed
stack, the processes an engine starts. The bottom layer: it imports no other part of lorabench."""
