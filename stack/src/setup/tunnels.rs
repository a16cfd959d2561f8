//! VXLAN tunnels at set-up: each tunnel's inner interface (its MTU from
//! the outer one's, less the tunnel's headers) and the socket-table
//! endpoints the GRO stage recognises on the tunnel's UDP port.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};

use crate::config::VxlanSpec;
use crate::error::{Error, Result};
use crate::iface::{Interface, Tunnel};
use crate::lookup::{Binding, Family};
use crate::route::Routes;
use crate::rx_queue::SocketQueue;
use crate::shared::{Shared, SocketCore};
use crate::wire::ipv4;
use crate::wire::ipv6;
use crate::wire::vxlan::OVERHEAD_V4;

/// The inner interface of tunnel `spec`, at `index`; its outer interface is
/// the one `routes` picks for the remote.
pub(super) fn inner_interface(
    spec: &VxlanSpec,
    index: u16,
    ifaces: &[Interface],
    routes: &Routes,
) -> Result<Interface> {
    let route = routes
        .lookup(ifaces, &spec.remote, None)
        .ok_or_else(|| Error::Config(format!("VXLAN VNI {}: no route to the remote {}", spec.vni, spec.remote)))?;
    let overhead = OVERHEAD_V4 + if spec.remote.is_ipv4() { 0 } else { (ipv6::HEADER_LEN - ipv4::HEADER_LEN) as u16 };
    let outer_mtu = ifaces[route.iface as usize].mtu;
    let mtu = spec.mtu.unwrap_or(outer_mtu.saturating_sub(overhead));
    if mtu + overhead > outer_mtu {
        return Err(Error::Config(format!(
            "VXLAN VNI {}: inner MTU {mtu} + {overhead} bytes of tunnel exceed the outer MTU {outer_mtu}",
            spec.vni
        )));
    }
    let mut ifc = Interface::new(
        index,
        u16::MAX,
        format!("vxlan{}", spec.vni),
        spec.inner_mac(),
        mtu,
        None,
        &spec.ipv4,
        &spec.ipv6,
    );
    ifc.tunnel = Some(Tunnel {
        vni: spec.vni,
        remote: SocketAddr::new(spec.remote, spec.remote_port),
        local_port: spec.local_port,
        outer: route.iface,
        local: route.src,
    });
    log::info!(
        "spate: interface {index} is VXLAN VNI {} to {} via interface {} (MTU {mtu}), {}",
        spec.vni,
        SocketAddr::new(spec.remote, spec.remote_port),
        route.iface,
        ifc.ipv4.iter().chain(&ifc.ipv6).map(|c| c.to_string()).collect::<Vec<_>>().join(" ")
    );
    Ok(ifc)
}

/// Registers one endpoint per tunnel port and family in the socket table,
/// each counted among the GRO stage's users for the stack's lifetime.
pub(super) fn register_endpoints(shared: &Shared) -> Result<()> {
    let mut done: Vec<(bool, u16)> = Vec::new();
    for t in shared.links.iter().filter_map(|i| i.tunnel) {
        let v4 = t.remote.is_ipv4();
        if done.contains(&(v4, t.local_port)) {
            continue;
        }
        done.push((v4, t.local_port));
        let id = shared.next_socket_id.fetch_add(1, Ordering::Relaxed);
        let core = Arc::new(SocketCore {
            id,
            queue: SocketQueue::new(shared.workers, 4096),
            error: AtomicI32::new(0),
            ident: AtomicU32::new(0),
            epoch: AtomicU64::new(0),
            gro: AtomicBool::new(false),
            tunnel: Some(t.local_port),
            read_delay: Default::default(),
            mcast_all: AtomicBool::new(true),
        });
        let any: IpAddr = if v4 { IpAddr::from([0u8; 4]) } else { IpAddr::from([0u16; 8]) };
        // Counted before it is published: a burst that sees the endpoint
        // runs the GRO stage.
        shared.gro_user(true);
        shared
            .sockets
            .bind(Binding {
                id,
                family: if v4 { Family::V4 } else { Family::V6 },
                local: SocketAddr::new(any, t.local_port),
                bound: any,
                peer: None,
                v6only: true,
                iface: None,
                reuseport: false,
                incoming_lcore: None,
                epoch: 0,
                sock: core,
            })
            .map_err(|_| Error::Config(format!("VXLAN port {} is taken", t.local_port)))?;
    }
    Ok(())
}
