#!/usr/bin/env bash
# The Debian packages the whole test suite needs (make test runs this first). Installs what is
# missing when run as root; otherwise says what is missing and goes on (the tests that need a
# package then fail or skip by their own rules, CI=true making them fail).
#   jq                         engine_clients/shell
#   g++, nlohmann-json3-dev    engine_clients/unreal
#   mono-mcs, Newtonsoft.Json  engine_clients/unity
#   debootstrap                real Godot's Debian sid chroot, the dist in bookworm and sid
#   tmux                       tests/process/test_oam_cli.py drives oam chat in tmux
#   qemu-user                  tests/shipping/test_cpu_variants.py: a llama turn on older CPU models
set -euo pipefail
need=()
command -v jq >/dev/null || need+=(jq)
command -v g++ >/dev/null || need+=(g++)
test -f /usr/include/nlohmann/json.hpp || need+=(nlohmann-json3-dev)
command -v mcs >/dev/null || need+=(mono-mcs)
ls /usr/lib/cli/Newtonsoft.Json*/Newtonsoft.Json.dll >/dev/null 2>&1 || need+=(libnewtonsoft-json-cil-dev)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v tmux >/dev/null || need+=(tmux)
command -v qemu-x86_64 >/dev/null || need+=(qemu-user)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "setup: missing system packages (install them to run every test): ${need[*]}" >&2
  exit 0
fi
echo "setup: installing system packages: ${need[*]}" >&2
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
