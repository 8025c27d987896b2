#!/usr/bin/env bash
# A local Docker engine for the docker sandbox backend and its tests:
#
#   bash scripts/docker_engine.sh start   # install docker.io if dockerd is missing (root, apt),
#                                         # start `dockerd --iptables=false --bridge=none`, wait
#                                         # for it, build the sandbox image (docker_image.sh)
#   bash scripts/docker_engine.sh stop    # stop the daemon `start` started
#
# Where no engine can run (not root, no apt, dockerd does not come up) `start` says why and
# exits 0, so CI goes on and the real-engine tests skip, naming the reason. Nonzero only when
# our own steps fail (the image build). Log: $RL4MLE_DOCKERD_LOG, /tmp/rl4mle-dockerd.log.
set -euo pipefail
cd "$(dirname "$0")/.."
LOG=${RL4MLE_DOCKERD_LOG:-${TMPDIR:-/tmp}/rl4mle-dockerd.log}
PIDFILE=${TMPDIR:-/tmp}/rl4mle-dockerd.pid
WAIT_S=${RL4MLE_DOCKERD_WAIT_S:-60}

skip() { echo "docker_engine: no Docker engine here: $*; the docker tests will skip"; exit 0; }

answers() { timeout 10 docker info >/dev/null 2>&1; }

start() {
  if command -v docker >/dev/null && answers; then
    echo "docker_engine: an engine already answers"
  else
    if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
      [ "$(id -u)" = 0 ] || skip "dockerd is not installed and we are not root (apt-get install docker.io)"
      command -v apt-get >/dev/null || skip "dockerd is not installed and there is no apt-get"
      echo "docker_engine: installing docker.io (apt)"
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
          --no-install-recommends docker.io >/dev/null; } || skip "apt-get install docker.io failed"
    fi
    [ "$(id -u)" = 0 ] || skip "dockerd needs root to start, and no engine answers"
    echo "docker_engine: starting dockerd (log: $LOG)"
    nohup dockerd --iptables=false --bridge=none >"$LOG" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
    for _ in $(seq "$WAIT_S"); do
      answers && break
      kill -0 "$(cat "$PIDFILE")" 2>/dev/null || break
      sleep 1
    done
    if ! answers; then
      tail -n 5 "$LOG" | sed 's/^/  dockerd: /'
      stop >/dev/null
      skip "dockerd did not answer within ${WAIT_S} s (log above)"
    fi
    echo "docker_engine: dockerd answers ($(docker info --format '{{.Driver}}, cgroup v{{.CgroupVersion}}'))"
  fi
  bash scripts/docker_image.sh
}

stop() {
  if [ ! -f "$PIDFILE" ]; then
    echo "docker_engine: no daemon started by this script"
    return 0
  fi
  pid=$(cat "$PIDFILE")
  if kill -0 "$pid" 2>/dev/null && grep -q dockerd "/proc/$pid/cmdline" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    echo "docker_engine: dockerd (pid $pid) stopped"
  fi
  rm -f "$PIDFILE"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
