"""gdpo_jax.sharding: one is_explicit (a mixed mesh is an error), one constrain, batch axes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from gdpo_jax import sharding
from gdpo_jax.core import segment
from gdpo_jax.train import mesh as mesh_lib

AXES = ("data", "fsdp", "tensor")


def _mesh(*types: AxisType, shape=(2, 2, 2)) -> jax.sharding.Mesh:
    return jax.make_mesh(shape, AXES, axis_types=types)


def test_is_explicit_uniform_meshes_and_none():
    assert sharding.is_explicit(_mesh(*(AxisType.Explicit,) * 3))
    assert not sharding.is_explicit(_mesh(*(AxisType.Auto,) * 3))
    assert not sharding.is_explicit(None)
    assert not sharding.is_explicit(jax.sharding.get_abstract_mesh())  # empty: no mesh set
    assert sharding.is_explicit(sharding.make_mesh((2, 2, 2)))
    assert not sharding.is_explicit(sharding.make_mesh((2, 2, 2), axis_types="auto"))


def test_mixed_mesh_is_a_clear_error_everywhere_it_matters():
    # The former copies disagreed here: any(...) said Explicit, all(...) said Auto.
    mixed = _mesh(AxisType.Explicit, AxisType.Auto, AxisType.Auto)
    with pytest.raises(ValueError, match=r"mix Explicit and Auto.*mesh.axis_types"):
        sharding.is_explicit(mixed)
    x = jnp.zeros((8, 2))
    with pytest.raises(ValueError, match="mix Explicit and Auto"):
        jax.jit(lambda x: sharding.constrain(x, mixed, P(("data", "fsdp"))))(x)
    with jax.set_mesh(mixed), pytest.raises(ValueError, match="mix Explicit and Auto"):
        jax.jit(segment.explicit_rows)(jax.device_put(x, NamedSharding(mixed, P("data"))))


@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_constrain_places_rows_for_both_axis_types(kind):
    mesh = sharding.make_mesh((2, 2, 2), axis_types=kind)
    x = jnp.arange(16.0).reshape(8, 2)
    spec = sharding.batch_spec(2)
    with jax.set_mesh(mesh):
        y = jax.jit(lambda x: sharding.constrain(x * 2, mesh, spec))(x)
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, spec), 2)
    np.testing.assert_array_equal(np.asarray(y), np.arange(16.0).reshape(8, 2) * 2)
    assert sharding.constrain(x, None, spec) is x  # no mesh: no-op


def test_constrain_with_context_mesh_matches_model_helper():
    mesh = sharding.make_mesh((4, 2, 1), axis_types="auto")
    with jax.set_mesh(mesh):
        f = jax.jit(
            lambda x: sharding.constrain(
                x,
                sharding.context_mesh(),
                sharding.sanitize_spec((sharding.BATCH_AXES,), (8,), mesh),
            )
        )
        y = f(jnp.ones(8))
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, P(("data", "fsdp"))), 1)
    assert sharding.context_mesh() is None


def test_batch_axes_and_divisibility():
    mesh = sharding.make_mesh((2, 2, 2))
    assert sharding.batch_axes(mesh) == ("data", "fsdp") and sharding.batch_axes(None) == ()
    assert sharding.batch_axis_size(mesh) == 4 and sharding.batch_axis_size(None) == 1
    sharding.check_batch_divisible(8, mesh, field="config.x")
    with pytest.raises(ValueError, match="config.x: 6 rows"):
        sharding.check_batch_divisible(6, mesh, field="config.x")


def test_public_entry_points_reexport_the_one_definition():
    from gdpo_jax import multihost
    from gdpo_jax.models import sharding as model_sharding
    from gdpo_jax.models import transformer
    from gdpo_jax.sampling import decode, hostio
    from gdpo_jax.train import distributed

    assert mesh_lib.make_mesh is sharding.make_mesh and mesh_lib.constrain is sharding.constrain
    assert mesh_lib.is_explicit is sharding.is_explicit
    assert model_sharding.sanitize_spec is sharding.sanitize_spec
    assert transformer.BATCH_AXES is decode.BATCH_AXES is mesh_lib.BATCH_AXES
    assert decode.batch_axes is sharding.batch_axes
    assert decode.batch_shards is sharding.batch_axis_size
    assert hostio.allgather is distributed.allgather_host is multihost.allgather
    assert distributed.to_host is multihost.to_host
    np.testing.assert_array_equal(multihost.allgather(np.arange(3)), [[0, 1, 2]])
