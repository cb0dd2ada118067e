"""Where a benchmark leaves its results: ``<name>.json`` (everything measured) and ``<name>.md``
(the report), side by side in one folder."""
import json
import os


def write(out_dir, name, result, markdown):
    """Write ``result`` as JSON and ``markdown`` next to it; returns the markdown."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(markdown)
    return markdown
