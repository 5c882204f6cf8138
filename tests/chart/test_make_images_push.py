"""`make images push IMAGE_PREFIX=...`: the three images under one prefix, pushed where the cluster
pulls from; without a prefix or without Docker it says so before doing anything."""

import subprocess

from chart_tools import REPO_ROOT


def make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_push_without_a_prefix_refuses_before_building_anything():
    done = make("-n", "images", "push")  # -n: had it got past the check, nothing would run anyway
    assert done.returncode != 0
    said = "make push: say where to push, e.g. `make images push IMAGE_PREFIX=my.registry/team`"
    assert said in done.stderr
    assert "docker" not in done.stdout  # refused while reading the Makefile, before any recipe


def test_push_pushes_the_three_images_under_the_prefix_and_tag():
    done = make("-n", "push", "IMAGE_PREFIX=my.registry/team", "IMAGE_TAG=v2")
    assert done.returncode == 0, done.stderr
    pushes = [line.strip(" ;\\") for line in done.stdout.splitlines() if "docker push" in line]
    assert pushes == ["docker push my.registry/team/$image:v2"]
    assert "for image in gateway worker operator" in done.stdout
    assert "--set imagePrefix=my.registry/team --set-string imageTag=v2" in done.stdout


def test_push_without_docker_says_so():
    done = make("push", "IMAGE_PREFIX=my.registry/team", "DOCKER=no-such-docker-command")
    assert done.returncode != 0
    assert "make push: no 'no-such-docker-command' command on this machine, so no images were pushed." in (
        done.stdout
    )
