"""Compiles CUDA C to PTX with NVRTC, called through ctypes (stdlib only).

Used by `cargo xtask ptx`; xtask itself stays std-only Rust, so the foreign
call to libnvrtc lives here. xtask fetches and unpacks the pinned NVRTC wheel
and runs this script with the wheel's lib folder on LD_LIBRARY_PATH (NVRTC
loads its builtins library from there).

    python3 nvrtc_ptx.py version LIBNVRTC
        prints "MAJOR.MINOR"
    python3 nvrtc_ptx.py compile LIBNVRTC SOURCE.cu OUT.ptx HEADER_DIR [OPTION ...]
        compiles SOURCE.cu with every *.cuh of HEADER_DIR given to NVRTC as an
        includable header, writes OUT.ptx; on failure prints NVRTC's log and
        exits with status 1.
"""

import ctypes
import os
import sys

NVRTC_SUCCESS = 0


def load(lib_path):
    lib = ctypes.CDLL(lib_path)
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def check(lib, status, what):
    if status != NVRTC_SUCCESS:
        message = lib.nvrtcGetErrorString(status).decode(errors="replace")
        raise RuntimeError(f"{what} failed: {message} ({status})")


def version(lib):
    major, minor = ctypes.c_int(), ctypes.c_int()
    check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return f"{major.value}.{minor.value}"


def c_strings(items):
    array = (ctypes.c_char_p * max(len(items), 1))()
    for i, item in enumerate(items):
        array[i] = item.encode()
    return array


def compile_ptx(lib, source_path, out_path, header_dir, options):
    with open(source_path, encoding="utf-8") as f:
        source = f.read()
    names = sorted(n for n in os.listdir(header_dir) if n.endswith(".cuh"))
    contents = []
    for name in names:
        with open(os.path.join(header_dir, name), encoding="utf-8") as f:
            contents.append(f.read())
    program = ctypes.c_void_p()
    check(
        lib,
        lib.nvrtcCreateProgram(
            ctypes.byref(program),
            source.encode(),
            os.path.basename(source_path).encode(),
            len(names),
            c_strings(contents),
            c_strings(names),
        ),
        "nvrtcCreateProgram",
    )
    try:
        status = lib.nvrtcCompileProgram(program, len(options), c_strings(options))
        log_size = ctypes.c_size_t()
        check(lib, lib.nvrtcGetProgramLogSize(program, ctypes.byref(log_size)), "log size")
        log = ctypes.create_string_buffer(log_size.value)
        check(lib, lib.nvrtcGetProgramLog(program, log), "log")
        text = log.value.decode(errors="replace").strip()
        if status != NVRTC_SUCCESS:
            sys.stderr.write(f"{source_path}: NVRTC failed:\n{text}\n")
            return 1
        if text:
            # Warnings are errors: the kernels must compile cleanly.
            sys.stderr.write(f"{source_path}: NVRTC warnings:\n{text}\n")
            return 1
        size = ctypes.c_size_t()
        check(lib, lib.nvrtcGetPTXSize(program, ctypes.byref(size)), "nvrtcGetPTXSize")
        ptx = ctypes.create_string_buffer(size.value)
        check(lib, lib.nvrtcGetPTX(program, ptx), "nvrtcGetPTX")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))
    with open(out_path, "wb") as f:
        f.write(ptx.value)
    return 0


def main(argv):
    if len(argv) >= 2 and argv[0] == "version":
        print(version(load(argv[1])))
        return 0
    if len(argv) >= 5 and argv[0] == "compile":
        lib = load(argv[1])
        return compile_ptx(lib, argv[2], argv[3], argv[4], argv[5:])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (OSError, RuntimeError) as e:
        sys.stderr.write(f"nvrtc_ptx.py: {e}\n")
        sys.exit(1)
