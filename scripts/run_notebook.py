"""Execute a notebook in a real kernel (headless) and print what each cell printed."""

import sys

import nbformat
from nbclient import NotebookClient


def main(path: str) -> None:
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3").execute()
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        print(">>>", cell.source.splitlines()[0] if cell.source else "")
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                print(output.text, end="")
            elif "data" in output and "text/plain" in output.data:
                print(output.data["text/plain"])
    print(f"\n{path}: all cells ran")


if __name__ == "__main__":
    main(sys.argv[1])
