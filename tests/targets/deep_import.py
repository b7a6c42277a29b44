"""The main thread stopped deep inside a chain of imports, as a job is while it imports torch:
`main` imports layer0, which imports layer1, ... and the innermost layer reads stdin inside
`serve()`. "ready" once it reads. Exits when its stdin closes.

The layers are written into a directory of their own (argv[1]) so that no file of the source
tree is one of them."""

import os
import sys

LAYERS = 20

directory = sys.argv[1]
for number in range(LAYERS):
    inner = (
        f"import layer{number + 1}\n"
        if number + 1 < LAYERS
        else (
            "import os, sys\n"
            "def serve():\n"
            "    print('ready', os.getpid(), flush=True)\n"
            "    for _ in sys.stdin:\n"
            "        pass\n"
            "serve()\n"
        )
    )
    with open(os.path.join(directory, f"layer{number}.py"), "w") as module:
        module.write(inner)
sys.path.insert(0, directory)


def main():
    import layer0  # noqa: F401


main()
