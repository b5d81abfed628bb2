"""The reference lives in the package (examples use it too); tests import it from here."""

from fused_ar.reference import add_rmsnorm_reference, allreduce_reference, assert_rmsnorm_matches, ulp_distance  # noqa: F401
