"""Three build steps on top of pyproject.toml: the packages, ``mlx_spec_hook.pth``
and the default drafters.

The packages are ``mlx_spec`` and its subpackages, plus the checkout's ``ui/``
installed as ``mlx_spec.ui`` (its imports of itself are relative), so the
installed command ``mlx_spec ui`` has it and no top-level ``ui`` lands in
site-packages.

The ``.pth`` file must sit at the root of site-packages, where no package
file goes, so ``build_py`` writes it there: into the wheel's root for
``pip install .``, and into the editable wheel for ``pip install -e .``
(PEP 660; setuptools points the ``install`` command at that wheel's
directory). Its one line comes from :mod:`mlx_spec_hook`.

The drafters that ship (``mlx_spec.home.SHIPPED_MODELS``) are copied from
``models/`` into the package as ``mlx_spec/shipped/NAME/`` (the files of each
folder, not its subfolders). An editable install reads them from ``models/``
itself, with ``MLX_SPEC_HOME`` set to the checkout (the Makefile does).
"""

import os
import runpy
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class build_py_with_pth(build_py):
    """``build_py`` that also writes the hook's ``.pth`` file."""

    def run(self):
        super().run()
        hook = runpy.run_path(os.path.join(HERE, "mlx_spec_hook.py"))
        if self.editable_mode:
            root = self.get_finalized_command("install").install_lib
        else:
            root = self.build_lib
        path = os.path.join(root, hook["PTH_NAME"])
        os.makedirs(root, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(hook["PTH_LINE"])
        self._pth_outputs = [path]
        if not self.editable_mode:
            self._pth_outputs += self.copy_shipped_models()

    def copy_shipped_models(self):
        """Copy the shipped drafters into ``build_lib``; return the files written."""
        home = runpy.run_path(os.path.join(HERE, "mlx_spec", "home.py"))
        written = []
        for name in home["SHIPPED_MODELS"]:
            source = os.path.join(HERE, home["MODELS"], name)
            if not os.path.isfile(os.path.join(source, "config.json")):
                raise FileNotFoundError(f"the shipped drafter {source} is missing")
            dest = os.path.join(self.build_lib, "mlx_spec", home["SHIPPED"], name)
            os.makedirs(dest, exist_ok=True)
            for entry in sorted(os.listdir(source)):
                if os.path.isfile(os.path.join(source, entry)):
                    shutil.copyfile(
                        os.path.join(source, entry), os.path.join(dest, entry)
                    )
                    written.append(os.path.join(dest, entry))
        return written

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + getattr(self, "_pth_outputs", [])


setup(
    packages=find_packages(include=["mlx_spec", "mlx_spec.*"]) + ["mlx_spec.ui"],
    package_dir={"mlx_spec.ui": "ui"},
    cmdclass={"build_py": build_py_with_pth},
)
