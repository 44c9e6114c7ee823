"""SPDL's decoders find FFmpeg's shared libraries here: PyAV's own copy, linked under the names SPDL looks for.

SPDL (`spdl-io`) ships no FFmpeg; its extension for FFmpeg N loads `libavutil.so.<major>` and its siblings
from the system or from its own folder. PyAV's wheel carries FFmpeg under hashed file names, and a process
that decodes with both should hold one FFmpeg, the one the CPU path's figures were measured with. So
`link_spdl_libraries` puts a symbolic link per library into SPDL's folder; PyAV, imported first, has already
loaded them and their dependencies, and the dynamic loader takes the link for the library it holds. Its NVDEC
extension also loads the driver's `libnvcuvid.so` by the plain name that only development packages install:
where that is missing, the driver's `libnvcuvid.so.1` is linked the same way.

Run `python -m mmdata.codecs.decoders.link_spdl` once after installing `mmdata[spdl]` (`make` does).
"""

from __future__ import annotations

import ctypes
import importlib
import subprocess
from pathlib import Path

import av

from mmdata.errors import MissingDependencyError

FFMPEG_LIBRARIES = ("avutil", "avcodec", "avformat", "avdevice", "avfilter", "swscale", "swresample")
LINK_COMMAND = "python -m mmdata.codecs.decoders.link_spdl"


def spdl_library_folder() -> Path:
    """The folder SPDL loads its extensions from (and, first, their FFmpeg libraries)."""
    try:
        lib = importlib.import_module("spdl.io.lib")
    except ImportError as exc:
        raise MissingDependencyError("SPDL is not installed: pip install 'mmdata[spdl]'") from exc
    if lib.__file__ is None:
        raise MissingDependencyError("SPDL's spdl.io.lib is not a folder of extensions: pip install 'mmdata[spdl]'")
    return Path(lib.__file__).parent


def pyav_ffmpeg() -> dict[str, Path]:
    """PyAV's FFmpeg libraries by the name SPDL loads them under (`libavutil.so.60` -> PyAV's file)."""
    folder = Path(av.__file__).resolve().parent.parent / "av.libs"
    found: dict[str, Path] = {}
    for name in FFMPEG_LIBRARIES:
        major = av.library_versions[f"lib{name}"][0]
        candidates = sorted(folder.glob(f"lib{name}-*.so.{major}*"))
        if not candidates:
            raise MissingDependencyError(
                f"PyAV's wheel holds no lib{name}.so.{major} in {folder} (a PyAV built against the system's FFmpeg"
                " needs no links: install FFmpeg's shared libraries, e.g. apt-get install libavformat-dev)"
            )
        found[f"lib{name}.so.{major}"] = candidates[0]
    return found


def driver_nvcuvid() -> Path | None:
    """The driver's `libnvcuvid.so.1` where the unversioned name SPDL's NVDEC extension loads is missing (only
    NVIDIA's development packages install it); None where it loads or there is no NVIDIA driver."""
    try:
        ctypes.CDLL("libnvcuvid.so")
        return None
    except OSError:
        pass
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in listing.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.startswith("libnvcuvid.so.1 ") and path:
            return Path(path)
    return None


def link_spdl_libraries() -> list[Path]:
    """Link PyAV's FFmpeg (and the driver's NVDEC library where its plain name is missing) into SPDL's folder;
    links already right are kept. The links made or checked."""
    folder = spdl_library_folder()
    targets = pyav_ffmpeg()
    nvcuvid = driver_nvcuvid()
    if nvcuvid is not None:
        targets["libnvcuvid.so"] = nvcuvid
    return [_link(folder / name, target) for name, target in targets.items()]


def _link(link: Path, target: Path) -> Path:
    if link.is_symlink() and link.resolve() == target.resolve():
        return link
    if link.exists() and not link.is_symlink():
        raise MissingDependencyError(f"{link} is a file, not a link mmdata made; remove it to link {target.name}")
    try:
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    except OSError as exc:
        raise MissingDependencyError(f"cannot link {link} -> {target}: {exc}") from exc
    return link


def spdl_problem() -> str | None:
    """Why SPDL's FFmpeg decoders cannot load in this process, with the fix; None when they load."""
    try:
        lib = importlib.import_module("spdl.io.lib")
        lib._libspdl.get_ffmpeg_versions()  # the first call imports the extension
    except ImportError:
        return "SPDL is not installed: pip install 'mmdata[spdl]'"
    except RuntimeError as exc:
        first = str(exc).split('", "')[0].strip('" ')
        return f"SPDL finds no FFmpeg it can load ({first}); run `{LINK_COMMAND}` to use PyAV's"
    return None


def spdl_nvdec_problem() -> str | None:
    """Why SPDL's NVDEC extension cannot load in this process, with the fix; None when it loads."""
    problem = spdl_problem()
    if problem is not None:
        return problem
    import torch  # loads the CUDA runtime (libcudart) the extension links against

    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch"
    try:
        built = importlib.import_module("spdl.io.lib")._libspdl_cuda.built_with_nvcodec()
    except (RuntimeError, ImportError, OSError, AttributeError) as exc:
        first = str(exc).split('", "')[0].strip('" ')
        return f"SPDL's NVDEC extension does not load ({first}); run `{LINK_COMMAND}`"
    return None if built else "this SPDL was built without NVDEC (x86-64 wheels have it; aarch64 ones do not)"
