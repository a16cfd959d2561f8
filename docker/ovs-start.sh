#!/bin/sh
# OVS-DPDK in a container, as tests/ovs_dpdk.rs runs it: a private
# database, DPDK in memory, a netdev bridge whose port 1 is a
# dpdkvhostuserclient connecting to spate's socket. Add the other ports and
# the flows for your network (flows are not kept across restarts).
set -eu
R=/var/run/openvswitch
mkdir -p "$R"
[ -f "$R/conf.db" ] || ovsdb-tool create "$R/conf.db" /usr/share/openvswitch/vswitch.ovsschema
ovsdb-server "$R/conf.db" --remote=punix:"$R/db.sock" --pidfile --detach --no-chdir
ovs-vsctl --no-wait init
ovs-vsctl --no-wait set Open_vSwitch . other_config:dpdk-init=true \
  other_config:dpdk-extra="--no-pci --in-memory --single-file-segments --no-telemetry" \
  other_config:dpdk-socket-mem=256
ovs-vsctl --no-wait -- --may-exist add-br br0 -- set Bridge br0 datapath_type=netdev fail_mode=secure \
  -- --may-exist add-port br0 spate0 -- set Interface spate0 type=dpdkvhostuserclient \
     options:vhost-server-path=/run/spate/vhu0.sock ofport_request=1
exec /usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk unix:"$R/db.sock" --pidfile --no-chdir
