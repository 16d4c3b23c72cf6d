"""Token-level speculative decoding and the exact losslessness checker.

Not policies: the machinery that proves which policies keep the target
distribution. :mod:`policies.lossless.sampler` runs real speculative decoding
on small token models with any policy; :mod:`policies.lossless.exact`
enumerates every branch of the same process and returns the exact law of the
outputs; :mod:`policies.lossless.laws` names the checks that law must pass
against the target's own law (each request's law, pairs, the joint law).
"""
