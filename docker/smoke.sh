#!/usr/bin/env bash
# Builds spate's container image with podman and smoke-runs it; part of
# `cargo xtask test`. No registry and no Docker engine are needed: the base
# image is made here with debootstrap and `podman import`, and the image's
# `prebuilt` target takes the binaries built on the host (docker/.bin/).
#
# 1. hugepages: spate-sink in the container on a server-mode
#    net_virtio_user port in a mounted socket directory, dpdk-testpmd on the
#    host as its vhost-user client sending into it;
# 2. --no-huge: spate-echo in the container joined to a test namespace on
#    net_pcap over a veth, the kernel in a peer namespace pinging it and
#    echoing UDP through it;
# both without --privileged. Then docker/compose.yaml is parsed by
# podman-compose, and
# 4. docker/k8s: the DaemonSet's pod (checked against pod.yaml and the
#    ConfigMap by docker/k8s/check.py) played by `podman kube play` with
#    the host's hugetlbfs mounted, spate-echo in it on a vhost-user socket
#    that dpdk-testpmd bridges to a veth, the kernel in a peer namespace
#    pinging it and echoing UDP through it; the probe's command run; the
#    pod taken down.
# Everything it creates is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
SUITE=bookworm
BASE=localhost/spate-debian:$SUITE
IMAGE=localhost/spate:smoke
TAG=spate-smoke-$$
WORK=$(mktemp -d /tmp/spate-smoke-XXXXXX)
NS_A=spate-ctr-$$-a
NS_B=spate-ctr-$$-b
step() { echo "=== container smoke: $*"; }

cleanup() {
  [ -f "$WORK/k8s-testpmd.pid" ] && kill "$(cat "$WORK/k8s-testpmd.pid")" 2>/dev/null || true
  podman pod rm -f "$TAG-k8s" >/dev/null 2>&1 || true
  podman rm -f "$TAG-huge" "$TAG-nohuge" >/dev/null 2>&1 || true
  podman volume rm -f "${TAG}_vhost-sockets" >/dev/null 2>&1 || true
  podman network rm -f "${TAG}_default" >/dev/null 2>&1 || true
  [ -f "$WORK/testpmd.pid" ] && kill "$(cat "$WORK/testpmd.pid")" 2>/dev/null || true
  ip netns del "$NS_A" 2>/dev/null || true
  ip netns del "$NS_B" 2>/dev/null || true
  rm -rf "$WORK" /var/run/dpdk/"$TAG" /var/run/dpdk/"$TAG-k8s"
}
trap cleanup EXIT

# podman here: runc (crun refuses this machine's hybrid cgroups), cgroupfs,
# file events, and explicit ulimits (without CAP_SYS_RESOURCE the runtime
# cannot raise them to podman's defaults).
if [ ! -f /etc/containers/containers.conf ]; then
  nofile=$(ulimit -Hn); [ "$nofile" = unlimited ] && nofile=1048576
  nproc=$(ulimit -Hu); { [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; } && nproc=32768
  mkdir -p /etc/containers
  cat > /etc/containers/containers.conf <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
[network]
network_backend = "netavark"
EOF
fi

if ! podman image exists "$BASE"; then
  step "base image $BASE (debootstrap minbase)"
  # The host's Debian mirrors (the only network these machines reach).
  mirror=$(apt-get indextargets --format '$(REPO_URI)' | grep -m1 -v security || true)
  security=$(apt-get indextargets --format '$(REPO_URI)' | grep -m1 security || true)
  [ -n "$mirror" ] || mirror=http://deb.debian.org/debian/
  debootstrap --variant=minbase "$SUITE" "$WORK/rootfs" "$mirror" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap.log"; exit 1; }
  {
    echo "deb $mirror $SUITE main"
    echo "deb $mirror $SUITE-updates main"
    [ -z "$security" ] || echo "deb $security $SUITE-security main"
  } > "$WORK/rootfs/etc/apt/sources.list"
  rm -rf "$WORK"/rootfs/var/cache/apt/archives/*.deb "$WORK"/rootfs/var/lib/apt/lists/*
  tar --numeric-owner -C "$WORK/rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
  rm -rf "$WORK/rootfs"
fi

step "image $IMAGE (target prebuilt: the host's release binaries)"
mkdir -p docker/.bin
cp target/release/spate-echo target/release/spate-sink target/release/spate-flood \
   target/release/spate-iperf target/release/spate-relay target/release/spate-stat docker/.bin/
podman build --network=host --target prebuilt --build-arg RUNTIME_BASE="$BASE" \
  -t "$IMAGE" -f docker/Dockerfile . >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; exit 1; }

step "1: hugepages, spate-sink on a vhost-user socket, testpmd on the host sending"
mkdir -p "$WORK/sock"
podman run -d --name "$TAG-huge" --network=none -v /dev/hugepages:/dev/hugepages -v "$WORK/sock:/run/spate" \
  --entrypoint /usr/local/bin/spate-sink "$IMAGE" \
  --vdev net_virtio_user0,path=/run/spate/vhu.sock,server=1,queue_size=1024,mac=02:53:50:41:54:45 \
  --ip 198.18.0.2/24 --lcores 0 --interval 0.5 --json >/dev/null
for _ in $(seq 300); do [ -S "$WORK/sock/vhu.sock" ] && break; sleep 0.1; done
[ -S "$WORK/sock/vhu.sock" ] || { podman logs "$TAG-huge"; echo "no vhost-user socket" >&2; exit 1; }
dpdk-testpmd -l 0,1 --main-lcore 1 --no-pci --no-telemetry --file-prefix "$TAG" --in-memory --single-file-segments \
  -m 256 --vdev "net_vhost0,iface=$WORK/sock/vhu.sock,queues=1,client=1" -- --forward-mode=txonly --txpkts=64 \
  --eth-peer=0,02:53:50:41:54:45 --tx-ip=198.18.0.1,198.18.0.2 --tx-udp=9,9 --nb-cores=1 \
  --total-num-mbufs=16384 --stats-period=1 >"$WORK/testpmd.log" 2>&1 </dev/null &
echo $! > "$WORK/testpmd.pid"
sleep 4
kill "$(cat "$WORK/testpmd.pid")"; wait "$(cat "$WORK/testpmd.pid")" 2>/dev/null || true
podman stop --time 10 "$TAG-huge" >/dev/null
podman logs "$TAG-huge" > "$WORK/huge.log" 2>&1
delivered=$(grep -o '"delivered":[0-9]*' "$WORK/huge.log" | cut -d: -f2 | awk '{s+=$1} END {print s+0}')
grep -q '"summary":true' "$WORK/huge.log" || { cat "$WORK/huge.log"; echo "no summary: did spate-sink stop cleanly?" >&2; exit 1; }
[ "$delivered" -gt 10000 ] || { cat "$WORK/huge.log"; echo "spate-sink delivered only $delivered" >&2; exit 1; }
echo "spate-sink in the container delivered $delivered datagrams from testpmd"

step "2: --no-huge, spate-echo in a test namespace on net_pcap, the kernel as peer"
ip netns add "$NS_A"
ip netns add "$NS_B"
ip link add vA netns "$NS_A" type veth peer name vB netns "$NS_B"
ip -n "$NS_A" link set vA address 02:53:50:41:54:45
ip -n "$NS_A" link set vA up
ip netns exec "$NS_A" sysctl -qw net.ipv6.conf.vA.disable_ipv6=1
ip -n "$NS_B" addr add 198.18.0.1/24 dev vB
ip -n "$NS_B" link set vB up
ip netns exec "$NS_B" ethtool -K vB tx off >/dev/null
podman run -d --name "$TAG-nohuge" --network "ns:/run/netns/$NS_A" --cap-add NET_ADMIN,NET_RAW "$IMAGE" \
  --vdev net_pcap0,iface=vA,phy_mac=1 --ip 198.18.0.2/24 --lcores 0 --interval 0 >/dev/null
# (Logs go to a file first: with pipefail, grep -q closing the pipe early
# would fail the pipeline.)
for _ in $(seq 300); do
  podman logs "$TAG-nohuge" > "$WORK/nohuge.log" 2>&1
  grep -q "UDP echo on" "$WORK/nohuge.log" && break
  sleep 0.1
done
grep -q -- "--no-huge" "$WORK/nohuge.log" || { cat "$WORK/nohuge.log"; echo "expected --no-huge" >&2; exit 1; }
ip netns exec "$NS_B" ping -c 3 -i 0.2 -W 2 198.18.0.2 >/dev/null
ip netns exec "$NS_B" python3 - <<'EOF'
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
for i in range(20):
    p = bytes([i]) * (i * 50)
    s.sendto(p, ('198.18.0.2', 7))
    d, _ = s.recvfrom(2048)
    assert d == p, (i, len(d))
print('echoed 20 datagrams through the container')
EOF
podman stop --time 10 "$TAG-nohuge" >/dev/null
podman logs "$TAG-nohuge" > "$WORK/nohuge.log" 2>&1
grep -q "Udp: InDatagrams=20 " "$WORK/nohuge.log" \
  || { cat "$WORK/nohuge.log"; echo "spate-echo's counters do not show the 20 datagrams" >&2; exit 1; }

step "3: docker/compose.yaml, parsed by podman-compose (a dry run of up)"
# podman-compose 1.0.3 has no `config`; its dry run parses the file and
# prints the podman commands, but still creates the project's volume and
# network, which the cleanup removes.
podman-compose --dry-run -p "$TAG" -f docker/compose.yaml up --no-build -d >"$WORK/compose.log" 2>&1 \
  || { cat "$WORK/compose.log"; exit 1; }
for svc in spate ovs; do
  grep -q "podman run --name=${TAG}_${svc}_1" "$WORK/compose.log" || { cat "$WORK/compose.log"; exit 1; }
done
step "4: docker/k8s: the DaemonSet's pod by podman kube play, hugepages, vhost-user bridged to the kernel"
mkdir -p "$WORK/k8s-vhost"
python3 docker/k8s/check.py --image "$IMAGE" --vhost-dir "$WORK/k8s-vhost" --name "$TAG-k8s" --out "$WORK/k8s-pod.yaml"
# The check can fail: a DaemonSet whose template drifted from the pod.
cp -r docker/k8s "$WORK/k8s-drift"
sed -i 's|image: localhost/spate:latest|image: localhost/spate:drifted|' "$WORK/k8s-drift/daemonset.yaml"
if python3 docker/k8s/check.py --dir "$WORK/k8s-drift" --image "$IMAGE" --vhost-dir "$WORK/k8s-vhost" \
     --name "$TAG-k8s" --out "$WORK/k8s-drift/pod.out" 2>/dev/null; then
  echo "docker/k8s/check.py passed a DaemonSet whose template differs from pod.yaml" >&2; exit 1
fi
podman kube play --network none --configmap docker/k8s/configmap.yaml "$WORK/k8s-pod.yaml" >"$WORK/kube.log" 2>&1 \
  || { cat "$WORK/kube.log"; exit 1; }
CTR="$TAG-k8s-spate-echo"
sock="$WORK/k8s-vhost/spate-echo.sock"
for _ in $(seq 300); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { podman logs "$CTR"; echo "the pod served no vhost-user socket" >&2; exit 1; }
# testpmd bridges the pod's port to the veth (the switch a node would
# run), from the namespace that holds the veth's spate end.
# Its forwarding lcore is CPU 1 (spate's is 0); a stats period keeps it
# running without a terminal.
ip netns exec "$NS_A" dpdk-testpmd -l 0,1 --main-lcore 0 --no-pci --no-telemetry --file-prefix "$TAG-k8s" \
  --in-memory --single-file-segments -m 256 --vdev "net_vhost0,iface=$sock,queues=1,client=1" \
  --vdev net_af_packet0,iface=vA -- --forward-mode=io --nb-cores=1 --total-num-mbufs=8192 --stats-period=10 \
  >"$WORK/k8s-testpmd.log" 2>&1 </dev/null &
echo $! > "$WORK/k8s-testpmd.pid"
ok=
for _ in $(seq 100); do
  ip netns exec "$NS_B" ping -c 1 -W 1 198.18.0.2 >/dev/null 2>&1 && { ok=1; break; }
done
[ -n "$ok" ] || { podman logs "$CTR"; cat "$WORK/k8s-testpmd.log"; echo "no ping answer through the pod" >&2; exit 1; }
ip netns exec "$NS_B" python3 - <<'EOF'
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
for i in range(20):
    p = bytes([i + 1]) * (i * 60)
    s.sendto(p, ('198.18.0.2', 7))
    d, _ = s.recvfrom(2048)
    assert d == p, (i, len(d))
print('echoed 20 datagrams through the pod')
EOF
# The readiness probe's command (podman 4.3 runs no probes).
podman exec "$CTR" /usr/local/bin/spate-stat --name echo >"$WORK/k8s-stat.log" 2>&1 \
  || { cat "$WORK/k8s-stat.log"; echo "the readiness probe's command failed" >&2; exit 1; }
grep -q "Udp" "$WORK/k8s-stat.log" || { cat "$WORK/k8s-stat.log"; echo "spate-stat showed no counters" >&2; exit 1; }
kill "$(cat "$WORK/k8s-testpmd.pid")"; wait "$(cat "$WORK/k8s-testpmd.pid")" 2>/dev/null || true
podman logs "$CTR" > "$WORK/k8s.log" 2>&1
# hugepages = "on" in the ConfigMap: spate refuses to start without them,
# and its log would name the fallback.
if grep -q -- "--no-huge" "$WORK/k8s.log"; then cat "$WORK/k8s.log"; echo "the pod ran without hugepages" >&2; exit 1; fi
podman kube play --down "$WORK/k8s-pod.yaml" >/dev/null
if podman pod exists "$TAG-k8s"; then echo "podman kube play --down left the pod" >&2; exit 1; fi
echo "the DaemonSet's pod echoed 20 datagrams with hugepages, and is gone"
echo "=== container smoke: OK"
