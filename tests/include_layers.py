#!/usr/bin/python3
"""No include runs from a lower layer of strata to a higher one.

Every module (a header in include/strata/ or src/, and the .cpp files named after it) has a
layer below; a file may include headers of its own layer or lower ones only. A file this
script does not know fails the check too, so a new module is placed on purpose.

    include_layers.py [REPO]        exit 0, or 1 listing each upward include and unknown file
"""
import os
import re
import sys

# Lowest first. A module's name is its header's file name without .h (or .def, .cuh).
LAYERS = [
    ("base", "error parse rng tensor memory files subprocess activity ops read_guard hdf5_util"),
    ("kernels", "kernels_cpu kernels_cuda common lanes dispatch cuda_module"),
    ("seams", "backend comm device_comm staged_device op_profile comm_threads trace metrics goodput prometheus job model_spec data "
              "h5_datasets cuda_loader elf_needed cuda_libraries int8"),
    ("config and grid", "config grid"),
    ("model", "layers model loss optim checkpoint checkpoint_write batch_on_backend"),
    ("parallelism and persistence", "pipeline pipeline_schedule data_parallel whole_model zero checkpoint_cache "
                                    "checkpointer watchdog evaluate generate prepare quantize"),
    ("the step", "run_plan train_step publisher step_hooks"),
    ("the session", "session"),
    ("the command line", "main command_line"),
]
LEVEL = {m: i for i, (_, mods) in enumerate(LAYERS) for m in mods.split()}
# .cpp files that implement a module of another name.
IMPLEMENTS = {
    "collectively": "comm", "checkpoint_sharded": "checkpoint", "checkpoint_int8": "checkpoint", "dataset": "data", "config_file": "config", "config_keys": "config", "loader": "data", "session_report": "session",
    "layers_gpt": "layers", "cuda_backend": "backend", "nccl_transport": "device_comm", "out_of_memory": "memory",
    "module": "backend", "embedding": "kernels_cpu", "layernorm": "kernels_cpu",
}
SOURCE_DIRS = ["include/strata", "src", "src/cuda", "src/nocuda", "src/cuda_loader",
               "kernels/cpu", "kernels/cuda"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"(?:strata/)?([^"/]+)\.(?:h|def|cuh)"', re.M)


def module_of(path):
    name = os.path.basename(path).rsplit(".", 1)[0]
    d = os.path.dirname(path)
    if d.startswith("kernels/"):
        return "kernels_cuda" if d == "kernels/cuda" and name not in LEVEL else (
            name if name in LEVEL else "kernels_cpu")
    return IMPLEMENTS.get(name, name)


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    problems, files = [], 0
    for d in SOURCE_DIRS:
        full = os.path.join(repo, d)
        if not os.path.isdir(full):
            continue
        for f in sorted(os.listdir(full)):
            if not f.endswith((".h", ".cpp", ".cu", ".cuh", ".def")):
                continue
            rel = os.path.join(d, f)
            mod = module_of(rel)
            if mod not in LEVEL:
                problems.append(f"{rel}: module '{mod}' has no layer in tests/include_layers.py")
                continue
            files += 1
            with open(os.path.join(full, f), encoding="utf-8") as fh:
                text = fh.read()
            for inc in INCLUDE.findall(text):
                if inc not in LEVEL:
                    problems.append(f"{rel}: includes '{inc}', which has no layer")
                elif LEVEL[inc] > LEVEL[mod]:
                    problems.append(f"{rel} ({LAYERS[LEVEL[mod]][0]}) includes {inc} "
                                    f"({LAYERS[LEVEL[inc]][0]}): upward")
    for p in problems:
        print(p)
    print(f"{files} files checked over {len(LAYERS)} layers: "
          f"{'no include runs upward' if not problems else f'{len(problems)} problems'}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
