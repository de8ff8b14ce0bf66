"""Operands and outputs: what the user passes in, checked before any work, and what the workers read and write.

:mod:`~dgemm.storage.locations` knows where an array lives however it is
spelt (and makes local paths absolute before anything reaches a worker),
:mod:`~dgemm.storage.operands` wraps the inputs, :mod:`~dgemm.storage.blocks`
is what a worker reads, :mod:`~dgemm.storage.outputs` checks, opens, creates
and writes the output, :mod:`~dgemm.storage.output_run` is one call's run on
it (opened fresh, replaced, resumed or in place; held by its lease,
:mod:`~dgemm.storage.lease`; completed or abandoned),
:mod:`~dgemm.storage.markers` records which of it is done, and
:mod:`~dgemm.storage.options` checks the ``storage_options`` of URLs.  This
package is dgemm's only user of zarr's private API.
"""
from __future__ import annotations

from dgemm.storage.blocks import ZarrBlock, load, read_block, read_error, unreadable
from dgemm.storage.locations import location
from dgemm.storage.markers import COMPLETE_ATTR, BlockMarkers, mark_complete, run_id
from dgemm.storage.operands import Operand, is_zarr_array
from dgemm.storage.options import check_storage_options, is_url
from dgemm.storage.outputs import OutputSpec, check_output, create_output, store_block

__all__ = ["COMPLETE_ATTR", "BlockMarkers", "Operand", "OutputSpec", "ZarrBlock", "check_output",
           "check_storage_options", "create_output", "is_url", "is_zarr_array", "load",
           "location", "mark_complete", "read_block", "read_error", "run_id", "store_block", "unreadable"]
