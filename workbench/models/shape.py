"""A model's shape for the cost model (``plan/``): its ``Preset`` (sizes, each part's
parameters, whether a block holds a matrix autocast does not cast).

``known_shape`` reads it without torch: the preset table, or the ``config.json`` of a folder or
hub id whose layout the preset formulas know (OPT, Llama). ``shape_of`` also counts any other
layout (``tiny:<model_type>``, a folder of another type) on the model itself, built on the meta
device (a tiny one on the CPU), which needs torch. ``plan/`` imports ``known_shape`` only and
never builds a model; a caller that plans any model passes ``shape=shape_of(model)``.
"""
from __future__ import annotations

import functools
import json
from dataclasses import replace

from workbench.config import ConfigError
from workbench.presets import PRESETS, TINY_PREFIX, Preset, lookup

#: The layouts whose parameters the preset formulas (``Preset.block_params`` ...) count.
FORMULAS = ("opt", "llama")


def known_shape(model: str) -> Preset:
    """The shape of a preset, or of a folder or hub id of an OPT / Llama layout (its
    config.json read, no torch).

    Raises:
        ConfigError: a layout only its built model can count (``tiny:<model_type>``, a folder of
            another type): ``shape_of`` counts it; or a config.json without a size the
            formulas need.
    """
    shape, complete = _read(model)
    if not complete:
        raise ConfigError([f"model: {model}: its parts are counted on the built model; plan it "
                           "with shape=models.shape.shape_of(model)"])
    return shape


@functools.lru_cache(maxsize=None)
def shape_of(model: str) -> Preset:
    """The shape of any model ``model=`` can name: ``known_shape`` where the formulas know the
    layout, else its parts counted on the model (kilobytes on the CPU for a tiny one; the meta
    device for a folder: seconds for the largest published models).

    Raises:
        ConfigError: one line, as a run gives it (a refused type, a config.json that does not
            describe a model).
    """
    shape, complete = _read(model)
    if complete:
        return shape
    from workbench.models.build import check_model_folder
    from workbench.models.castable import model_uncast
    from workbench.models.counts import counted, folder_counts, tiny_preset

    if model.startswith(TINY_PREFIX):
        check_model_folder(model)  # a refused type: one line (ConfigError), as run gives
        counted_shape = tiny_preset(model)
    else:
        from workbench.models.hub import config_path

        counted_shape = counted(shape, folder_counts(config_path(model)))
    return replace(counted_shape, uncast=bool(model_uncast(model)))


def _read(model: str) -> tuple[Preset, bool]:
    """(the shape as far as the preset table or config.json give it, whether that is all of
    it: False where the parts must be counted on the model)."""
    if model in PRESETS:
        return PRESETS[model], True
    if model.startswith(TINY_PREFIX):
        preset = lookup(model)
        return preset, False  # counted on the built model, whatever its type
    from workbench.models.hub import config_path

    c = json.loads(config_path(model).read_text())  # a hub id: fetched once
    opt = c.get("model_type") == "opt"
    formulas = c.get("model_type") in FORMULAS
    hf = {k: c[k] for k in ("num_key_value_heads", "word_embed_proj_dim", "do_layer_norm_before")
          if k in c}
    hf["tie_word_embeddings"] = c.get("tie_word_embeddings", opt)
    try:
        ffn = c.get("ffn_dim") or c.get("intermediate_size")
        if ffn is None and formulas:
            raise KeyError("intermediate_size")
        p = Preset("opt" if opt else "llama", c["hidden_size"], c["num_hidden_layers"],
                   c["num_attention_heads"], ffn or 0, c["vocab_size"],
                   c.get("max_position_embeddings", 2048), "local", hf=hf)
    except KeyError as e:
        raise ConfigError([f"model: {model}: config.json has no {e.args[0]!r}, which the "
                           "planner needs"]) from None
    # any other layout (experts, latent attention, hybrid layers) is counted on the model its
    # config describes
    return (p, True) if formulas else (replace(p, family=c.get("model_type", "llama")), False)
