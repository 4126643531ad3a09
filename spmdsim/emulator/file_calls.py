"""mpi4py's data calls of ``MPI.File`` on simulated ranks, each one line over spmdsim.emulator.file_access's four
ways to place the data: at an explicit offset (``_at``), at the rank's file pointer (``_here``), at the shared
file pointer (``_shared``) and in rank order from it (``_ordered``)."""
from __future__ import annotations

from typing import Any

from .file_access import FileAccess

__all__ = ["FileCalls"]


class FileCalls(FileAccess):
    """The Read and Write calls of SimFile (a mixin)."""

    # -- explicit offsets --------------------------------------------------------------------------

    def Read_at(self, offset: int, buf: Any, status: Any = None) -> None:
        self._at("Read_at", False, offset, buf, status)

    def Write_at(self, offset: int, buf: Any, status: Any = None) -> None:
        self._at("Write_at", True, offset, buf, status)

    def Read_at_all(self, offset: int, buf: Any, status: Any = None) -> None:
        self._at("Read_at_all", False, offset, buf, status, together=True)

    def Write_at_all(self, offset: int, buf: Any, status: Any = None) -> None:
        self._at("Write_at_all", True, offset, buf, status, together=True)

    def Iread_at(self, offset: int, buf: Any) -> Any:
        return self._request(self._at("Iread_at", False, offset, buf, None))

    def Iwrite_at(self, offset: int, buf: Any) -> Any:
        return self._request(self._at("Iwrite_at", True, offset, buf, None))

    def Iread_at_all(self, offset: int, buf: Any) -> Any:
        return self._request(self._at("Iread_at_all", False, offset, buf, None))

    def Iwrite_at_all(self, offset: int, buf: Any) -> Any:
        return self._request(self._at("Iwrite_at_all", True, offset, buf, None))

    def Read_at_all_begin(self, offset: int, buf: Any) -> None:
        self._begin("Read_at_all", lambda: self._at("Read_at_all", False, offset, buf, None, together=True))

    def Read_at_all_end(self, buf: Any, status: Any = None) -> None:
        self._end("Read_at_all", status)

    def Write_at_all_begin(self, offset: int, buf: Any) -> None:
        self._begin("Write_at_all", lambda: self._at("Write_at_all", True, offset, buf, None, together=True))

    def Write_at_all_end(self, buf: Any, status: Any = None) -> None:
        self._end("Write_at_all", status)

    # -- the rank's own file pointer ------------------------------------------------------------------

    def Read(self, buf: Any, status: Any = None) -> None:
        self._here("Read", False, buf, status)

    def Write(self, buf: Any, status: Any = None) -> None:
        self._here("Write", True, buf, status)

    def Read_all(self, buf: Any, status: Any = None) -> None:
        self._here("Read_all", False, buf, status, together=True)

    def Write_all(self, buf: Any, status: Any = None) -> None:
        self._here("Write_all", True, buf, status, together=True)

    def Iread(self, buf: Any) -> Any:
        return self._request(self._here("Iread", False, buf, None))

    def Iwrite(self, buf: Any) -> Any:
        return self._request(self._here("Iwrite", True, buf, None))

    def Iread_all(self, buf: Any) -> Any:
        return self._request(self._here("Iread_all", False, buf, None))

    def Iwrite_all(self, buf: Any) -> Any:
        return self._request(self._here("Iwrite_all", True, buf, None))

    def Read_all_begin(self, buf: Any) -> None:
        self._begin("Read_all", lambda: self._here("Read_all", False, buf, None, together=True))

    def Read_all_end(self, buf: Any, status: Any = None) -> None:
        self._end("Read_all", status)

    def Write_all_begin(self, buf: Any) -> None:
        self._begin("Write_all", lambda: self._here("Write_all", True, buf, None, together=True))

    def Write_all_end(self, buf: Any, status: Any = None) -> None:
        self._end("Write_all", status)

    # -- the shared file pointer -------------------------------------------------------------------

    def Read_shared(self, buf: Any, status: Any = None) -> None:
        self._shared("Read_shared", False, buf, status)

    def Write_shared(self, buf: Any, status: Any = None) -> None:
        self._shared("Write_shared", True, buf, status)

    def Iread_shared(self, buf: Any) -> Any:
        return self._request(self._shared("Iread_shared", False, buf, None))

    def Iwrite_shared(self, buf: Any) -> Any:
        return self._request(self._shared("Iwrite_shared", True, buf, None))

    def Read_ordered(self, buf: Any, status: Any = None) -> None:
        self._ordered("Read_ordered", False, buf, status)

    def Write_ordered(self, buf: Any, status: Any = None) -> None:
        self._ordered("Write_ordered", True, buf, status)

    def Read_ordered_begin(self, buf: Any) -> None:
        self._begin("Read_ordered", lambda: self._ordered("Read_ordered", False, buf, None))

    def Read_ordered_end(self, buf: Any, status: Any = None) -> None:
        self._end("Read_ordered", status)

    def Write_ordered_begin(self, buf: Any) -> None:
        self._begin("Write_ordered", lambda: self._ordered("Write_ordered", True, buf, None))

    def Write_ordered_end(self, buf: Any, status: Any = None) -> None:
        self._end("Write_ordered", status)
