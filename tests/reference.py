"""The reference lives in the package (examples use it too); tests import it from here."""

from fused_ar.reference import add_rmsnorm_reference, allreduce_reference, assert_rmsnorm_matches, prime_allocator, ulp_distance  # noqa: F401,E501
