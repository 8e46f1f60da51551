"""tfx_vec: TensorFlow plugins that make code written for one example run batched, compiled
and fast."""
import re
from pathlib import Path

from setuptools import find_packages, setup

_VERSION = re.search(r'__version__ = "([^"]+)"',
                     (Path(__file__).parent / "tfx_vec" / "__init__.py").read_text()).group(1)

# Tested set (2026-11): tensorflow 2.21.0, tensorflow-probability 0.25.0, tf-keras 2.21.0,
# gast 0.7.0, islpy 2026.2.2, numpy 2.x, Python 3.11.  The ranges below are the ones we
# believe work; the lower bounds are where the APIs we use appeared.
_INSTALL = [
    "tensorflow>=2.16,<2.23",
    "tensorflow-probability>=0.24,<0.27",
    "tf-keras>=2.16,<2.23",
    "gast>=0.5.3",
    "islpy>=2024.1",
    "numpy>=1.26",
]
# DP-SGD's privacy accounting (tfx_vec.pfor.dp_sgd.compute_epsilon) uses dp-accounting.
_DP = ["dp-accounting>=0.4"]
_TEST = ["pytest>=7", "hypothesis>=6.80", "scipy>=1.10"] + _DP
_BENCH = ["matplotlib>=3.7", "tqdm>=4.60"]

setup(
    name="tfx_vec",
    version=_VERSION,
    description=" ".join(__doc__.split(": ", 1)[1].split()),
    long_description=Path(__file__).with_name("README.md").read_text(),
    long_description_content_type="text/markdown",
    # No project URL: the project has no public home yet, and a guessed one would mislead.
    license="Apache-2.0",
    license_files=["LICENSE"],
    keywords=["tensorflow", "vectorization", "pfor", "jacobian", "per-example gradients",
              "autobatching", "NUTS", "MCMC", "XLA", "lazy tensor", "tensor comprehensions",
              "polyhedral compilation", "code generation"],
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: Scientific/Engineering :: Mathematics",
        "Topic :: Software Development :: Compilers",
    ],
    python_requires=">=3.10",
    packages=find_packages(include=["tfx_vec", "tfx_vec.*"]),
    # The TF custom op's C++ source is compiled at run time against the installed TensorFlow.
    package_data={"tfx_vec.tc_ops": ["tf_op/*.cc", "tf_op/*.h"], "tfx_vec.lazy": ["*.cc"]},
    install_requires=_INSTALL,
    extras_require={
        "test": _TEST,
        "bench": _BENCH,
        "dp": _DP,
        # pycuda only builds where a CUDA driver (libcuda) is installed; imported lazily.
        "cuda": ["pycuda>=2022.1"],
        "opencl": ["pyopencl>=2023.1"],
    },
)
