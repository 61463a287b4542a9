"""Generation engines behind one interface: :class:`GenerationEngine`."""

from rpeg.runtime.engines.base import GenerationEngine, GenerationOutput, SamplingParams
from rpeg.runtime.engines.torch_engine import TorchEngine

__all__ = ["GenerationEngine", "GenerationOutput", "SamplingParams", "TorchEngine"]
