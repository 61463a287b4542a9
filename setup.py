"""Packaging glue: the top-level folders flows/, tasks/ and infra/ install as rpeg.flows,
rpeg.tasks and rpeg.infra, so no generic top-level names land in site-packages.
Everything else lives in pyproject.toml."""

from setuptools import find_packages, setup

MAPPED = {"rpeg.flows": "flows", "rpeg.tasks": "tasks", "rpeg.infra": "infra"}

packages = find_packages(include=["rpeg", "rpeg.*"])
package_dir = {"rpeg": "rpeg"}
for dotted, folder in MAPPED.items():
    package_dir[dotted] = folder
    packages.append(dotted)
    packages += [f"{dotted}.{sub}" for sub in find_packages(where=folder)]

setup(packages=packages, package_dir=package_dir)
