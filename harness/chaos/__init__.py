"""The chaos run: ``run`` drives it and audits it, ``workflows`` adds the workflows' part."""

from __future__ import annotations
