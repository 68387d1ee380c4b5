"""One core per engine-checked policy; importing this package registers them all."""
from . import trtllm_v2  # noqa: F401
from . import vllm_v1  # noqa: F401
from . import hf_cb  # noqa: F401
from . import trtllm_v1  # noqa: F401
from . import sglang  # noqa: F401
