"""Matplotlib pictures (PNG/SVG) of a LayoutPicture; matplotlib is imported when called.

No pyplot and no global backend switch: a bare Figure on an Agg canvas, so
drawing works headless and leaves a user's interactive backend alone.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from typing import Any, Optional, Sequence, Union

from ...errors import SpmdsimError
from ...layouts.layout import TensorLayout
from .model import LayoutPicture, PictureArgumentError, as_picture

__all__ = ["PICTURE_SUFFIXES", "MAX_PICTURE_RANKS", "check_picture_path", "check_picture_ranks", "picture_directory",
           "render_layout_png", "draw_layout", "draw_tensor_panel", "shard_colour", "new_figure", "save_figure"]

_HATCH = "///"

#: File types the pictures can be written as (matplotlib picks the writer by suffix).
PICTURE_SUFFIXES = ("png", "svg", "pdf")

#: Most ranks a layout picture draws (a labelled cell per rank, a labelled block per shard): a 16 x 16 device
#: matrix still reads. Each rank took matplotlib ~25 ms (1,024 ranks: 25 s), and 65,536 ran past 5 minutes
#: holding 850 MB of figure, for a picture no one could read.
MAX_PICTURE_RANKS = 256


def check_picture_ranks(ranks: int, flag: str = "", instead: str = "") -> None:
    """SpmdsimError, before any drawing, for a layout picture of more than MAX_PICTURE_RANKS ranks; `flag`
    (``--png``) is named in the message, and `instead` says what prints every rank."""
    if ranks > MAX_PICTURE_RANKS:
        given = f"{flag} draws" if flag else "a layout picture draws"
        raise SpmdsimError(f"{given} up to {MAX_PICTURE_RANKS} ranks, one cell each; this layout has {ranks:,}"
                           + (f": leave it out ({instead})" if instead else ""))


#: The temporary config folder given to matplotlib where its default one cannot be written (removed at exit).
_CONFIG_FOLDERS: list = []


def _default_folders_writable() -> bool:
    """Whether matplotlib's default config and cache folders can be used, by matplotlib's own test (made if
    missing, then os.access): where they cannot, it warns in two lines on stderr and uses a temporary folder."""
    home = os.path.expanduser("~")
    if home == "~":  # no home to resolve
        return False
    if sys.platform.startswith(("linux", "freebsd")):
        bases = (os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"),
                 os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"))
        folders = [os.path.join(base, "matplotlib") for base in bases]
    elif sys.platform == "win32":  # (%LOCALAPPDATA% or an older folder: matplotlib's choice, left to it)
        return True
    else:
        folders = [os.path.join(home, ".matplotlib")]
    for folder in map(os.path.realpath, folders):
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError:
            return False
        if not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
            return False
    return True


def _config_folder() -> None:
    """Before matplotlib's first import: a temporary MPLCONFIGDIR where the user set none and matplotlib's
    default folders cannot be written (a read-only or missing HOME), so that no warning of matplotlib's prints;
    a user's MPLCONFIGDIR is never replaced. One SpmdsimError line where no temporary folder can be made."""
    if "matplotlib" in sys.modules or os.environ.get("MPLCONFIGDIR"):
        return
    if importlib.util.find_spec("matplotlib") is None or _default_folders_writable():  # (none: no folder made)
        return
    try:
        folder = tempfile.TemporaryDirectory(prefix="spmdsim-matplotlib-")
    except OSError as exc:
        raise SpmdsimError(f"pictures need a writable folder for matplotlib's settings and font cache: "
                           f"{os.path.expanduser('~')!r} cannot be written and a temporary folder could not be "
                           f"made ({exc.strerror or exc}); expected MPLCONFIGDIR set to a writable folder") from None
    _CONFIG_FOLDERS.append(folder)
    os.environ["MPLCONFIGDIR"] = folder.name


def _matplotlib() -> Any:
    """matplotlib, or one SpmdsimError line with the README's install command for it."""
    _config_folder()
    try:
        import matplotlib
    except ImportError:
        raise SpmdsimError(
            'pictures need matplotlib: pip install -e ".[plot]" in the spmdsim checkout '
            "(or pip install matplotlib)"
        ) from None
    return matplotlib


def require_matplotlib() -> None:
    """Raise before any work when a picture was asked for and matplotlib is missing."""
    _matplotlib()


def picture_directory(directory: Union[str, os.PathLike]) -> str:
    """`directory` as a string, made (with its parents) where it is missing; one SpmdsimError line where it
    cannot be."""
    directory = os.fspath(directory)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise SpmdsimError(f"cannot make picture directory {directory!r}: {exc.strerror or exc}") from None
    return directory


def shard_colour(shard_number: int, num_shards: int) -> Any:
    """RGBA colour of a shard: tab20 up to 20 shards, an even spread of 'turbo' beyond."""
    matplotlib = _matplotlib()

    if num_shards <= 20:
        return matplotlib.colormaps["tab20"](shard_number % 20)
    return matplotlib.colormaps["turbo"]((shard_number + 0.5) / num_shards)


def new_figure(width: float, height: float) -> Any:
    """A pyplot-free Figure with an Agg canvas."""
    _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def check_picture_path(path: Union[str, os.PathLike], flag: str = "") -> str:
    """The path as a string, or SpmdsimError when its suffix is not a picture type we write; `flag`: the option
    that gave it (``--png``), named in the message."""
    if not isinstance(path, (str, os.PathLike)):
        given = f"{flag} {path!r}" if flag else f"picture path {path!r}"
        raise PictureArgumentError(f"{given} is not a file path; expected a str or os.PathLike such as "
                                   "'grid.png'")
    path = os.fspath(path)
    suffix = os.path.splitext(path)[1].lower().lstrip(".")
    if suffix not in PICTURE_SUFFIXES:
        given = f"{flag} {path!r}: picture file" if flag else f"picture file {path!r}"
        raise SpmdsimError(f"{given} must end in one of {tuple('.' + s for s in PICTURE_SUFFIXES)!r}")
    return path


def save_figure(fig: Any, path: Union[str, os.PathLike], dpi: int) -> str:
    path = check_picture_path(path)
    directory = os.path.dirname(path)
    try:
        if directory:
            os.makedirs(directory, exist_ok=True)
        fig.savefig(path, dpi=dpi)
    except OSError as exc:
        # One line naming the file, not a traceback from deep inside matplotlib.
        raise SpmdsimError(f"cannot write picture {path!r}: {exc.strerror or exc}") from None
    return path


def render_layout_png(
    picture: Union[LayoutPicture, TensorLayout],
    path: Union[str, os.PathLike],
    shape: Optional[Sequence[int]] = None,
    *,
    name: str = "x",
    dpi: int = 120,
) -> str:
    """Draw the tensor blocks and the device matrix side by side; returns the path written.

    The file type follows the suffix (.png, .svg, .pdf). Pass a LayoutPicture,
    or a TensorLayout with `shape`.
    """
    if isinstance(shape, (str, os.PathLike)) and not isinstance(path, (str, os.PathLike)):
        # render_layout_ascii(tl, shape) takes the shape second: its order here would fail in os.fspath.
        raise PictureArgumentError(f"render_layout_png(layout, path, shape) takes the path before the shape; got "
                                   f"path {path!r} and shape {shape!r}: expected render_layout_png(layout, {shape!r}, "
                                   f"{path!r})")
    check_picture_path(path)
    picture = as_picture(picture, shape, name, "render_layout_png(tensor_layout, path, shape)")
    t_rows, t_cols = picture.panel_grid
    d_rows, d_cols = picture.device_grid
    width = min(24.0, 1.0 + 3.4 * (t_cols + d_cols))
    height = min(18.0, 1.8 + 3.0 * max(t_rows, d_rows) + 0.25 * len(picture.notes))
    fig = new_figure(width, height)
    draw_layout(fig, picture)
    return save_figure(fig, path, dpi)


def draw_layout(fig: Any, picture: LayoutPicture, label: str = "") -> None:
    """Draw `picture` on a (sub)figure: tensor panels left, device matrix right.

    `label` prefixes the title (e.g. "before" / "after" in plan pictures).
    """
    t_rows, t_cols = picture.panel_grid
    d_rows, d_cols = picture.device_grid
    layout = picture.tensor_layout.layout
    check_picture_ranks(layout.num_devices)
    lead = f"{label}: " if label else ""
    fig.suptitle(f"{lead}{picture.title}\non {layout}", fontsize=11, y=0.995)
    left, right = fig.subfigures(1, 2, width_ratios=[t_cols, d_cols])
    left.text(0.5, 0.885, "tensor: ranks holding each block", ha="center", va="top", fontsize=9)
    right.text(0.5, 0.885, "device matrix: each rank's shard", ha="center", va="top", fontsize=9)
    t_axes = left.subplots(t_rows, t_cols, squeeze=False)
    for panel in picture.panels:
        draw_tensor_panel(t_axes[panel.grid_pos], panel, picture)
    d_axes = right.subplots(d_rows, d_cols, squeeze=False)
    for panel in picture.device_panels:
        _draw_device_panel(d_axes[panel.grid_pos], panel, picture)
    if picture.notes:
        fig.text(0.01, 0.005, "\n".join(picture.notes), fontsize=8, va="bottom")
    fig.subplots_adjust(bottom=0.12 + 0.03 * len(picture.notes), top=0.82)
    for sub in (left, right):
        sub.subplots_adjust(bottom=0.16 + 0.03 * len(picture.notes), top=0.74, wspace=0.35, hspace=0.45)


def _fontsize(rows: int, cols: int) -> float:
    return max(5.0, min(10.0, 28.0 / max(rows, cols, 1)))


def draw_tensor_panel(ax: Any, panel: Any, picture: LayoutPicture, scale: float = 1.0) -> None:
    """One panel of tensor blocks on `ax`, labels `scale` times the default size."""
    rows, cols = len(panel.blocks), len(panel.blocks[0])
    size = _fontsize(rows, cols) * scale
    # Floats: matplotlib cannot place Python ints past int64 (a 2**70-row tensor).
    col_edges, row_edges = [float(e) for e in panel.col_edges], [float(e) for e in panel.row_edges]
    for i, row in enumerate(panel.blocks):
        for j, block in enumerate(row):
            _box(ax, col_edges[j], row_edges[i], col_edges[j + 1], row_edges[i + 1], block, picture, size)
    ax.set_xlim(col_edges[0], col_edges[-1])
    ax.set_ylim(row_edges[-1], row_edges[0])  # row 0 on top, like a matrix
    ax.set_xticks(col_edges)
    ax.set_yticks(row_edges if panel.row_dim is not None else [])
    ax.tick_params(labelsize=7 * scale)
    ax.xaxis.tick_top()
    ax.set_xlabel(f"dim {panel.col_dim}", fontsize=8 * scale)
    if panel.row_dim is not None:
        ax.set_ylabel(f"dim {panel.row_dim}", fontsize=8 * scale)
    ax.set_title(panel.title, fontsize=8 * scale, pad=14)


def _box(ax: Any, x0: float, y0: float, x1: float, y1: float, item: Any, picture: LayoutPicture,
         size: float) -> None:
    """A block or device cell: its shard's colour, hatched when partial, labelled with ranks and shard."""
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0,
                           facecolor=shard_colour(item.shard_number, picture.num_shards),
                           edgecolor="black", linewidth=1.0, hatch=_HATCH if item.partial else None))
    ax.text((x0 + x1) / 2, (y0 + y1) / 2, f"{item.label}\n#{item.shard_number}",
            ha="center", va="center", fontsize=size,
            bbox={"facecolor": "white", "alpha": 0.7, "linewidth": 0, "pad": 1})


def _draw_device_panel(ax: Any, panel: Any, picture: LayoutPicture) -> None:
    rows, cols = len(panel.cells), len(panel.cells[0])
    size = _fontsize(rows, cols)
    for i, row in enumerate(panel.cells):
        for j, cell in enumerate(row):
            _box(ax, j, i, j + 1, i + 1, cell, picture, size)
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_aspect("equal")
    ax.set_xticks([j + 0.5 for j in range(cols)], list(panel.col_labels))
    ax.set_yticks([i + 0.5 for i in range(rows)], list(panel.row_labels))
    ax.xaxis.tick_top()
    ax.tick_params(labelsize=7, length=0)
    if panel.title:
        ax.set_title(panel.title, fontsize=8, pad=14)
