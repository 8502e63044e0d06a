"""Packaging for triage_cf, read from nbdev's settings.ini (no pkg_resources, which newer setuptools lack)."""
from configparser import ConfigParser
from pathlib import Path

import setuptools

cfg = ConfigParser(delimiters=["="])
cfg.read(Path(__file__).with_name("settings.ini"), encoding="utf-8")
cfg = cfg["DEFAULT"]

requirements = cfg.get("requirements", "").split()
dev_requirements = cfg.get("dev_requirements", "").split()
llm_requirements = cfg.get("llm_requirements", "").split()
gpu_requirements = cfg.get("gpu_requirements", "").split()
llamacpp_requirements = cfg.get("llamacpp_requirements", "").split()

setuptools.setup(
    name=cfg["lib_name"],
    version=cfg["version"],
    description=cfg["description"],
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    keywords=cfg.get("keywords", "").split(),
    url=cfg["git_url"],
    project_urls={"Source": cfg["git_url"]},
    classifiers=["Programming Language :: Python :: 3", "Intended Audience :: Science/Research",
                 "License :: OSI Approved :: Apache Software License"],
    scripts=[],
    author=cfg["author"],
    author_email=cfg["author_email"],
    license="Apache-2.0",
    python_requires=">=" + cfg["min_python"],
    packages=setuptools.find_packages(include=["triage_cf", "triage_cf.*"]),
    include_package_data=True,
    package_data={"triage_cf": ["resources/*", "resources/*/*"]},
    install_requires=requirements,
    extras_require={"dev": dev_requirements, "llm": llm_requirements, "gpu": gpu_requirements, "llamacpp": llamacpp_requirements},
    entry_points={"console_scripts": cfg.get("console_scripts", "").split(), "nbdev": [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"]},
    zip_safe=False,
)
