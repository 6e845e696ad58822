"""Every data source, by name: the file sources of data/sources.py and the sources a model writes, whose entries sit
beside their builders in this package (a builder generates as the evaluation does, so it cannot live in data/). This
is the registry `data build --source`, the Data page's picker and build form, and the background build's launcher
read; a source a model writes is its module's `DataSource` entry, named here."""

from __future__ import annotations

from ...data.sources import FILE_SOURCES, DataSource
from .own_summaries import OWN_SUMMARIES

SOURCES: dict[str, DataSource] = {**FILE_SOURCES, **{s.name: s for s in (OWN_SUMMARIES,)}}
