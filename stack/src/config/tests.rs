//! The configuration's unit tests.

use std::net::Ipv4Addr;

use super::*;

#[test]
fn cidrs() {
    let c: Cidr = "198.18.0.2/24".parse().unwrap();
    assert!(c.contains(&"198.18.0.200".parse().unwrap()));
    assert!(!c.contains(&"198.18.1.1".parse().unwrap()));
    assert_eq!(c.broadcast(), Some(Ipv4Addr::new(198, 18, 0, 255)));
    let c6: Cidr = "fd00::2/64".parse().unwrap();
    assert!(c6.contains(&"fd00::99".parse().unwrap()));
    assert!(!c6.contains(&"fd01::1".parse().unwrap()));
    for bad in ["198.18.0.2", "198.18.0.2/33", "fd00::1/129", "0.0.0.0/0", "x/1", "224.0.0.1/4"] {
        assert!(bad.parse::<Cidr>().is_err(), "{bad}");
    }
}

#[test]
fn names_that_look_like_an_unnamed_stacks_are_refused() {
    let named = |n: &str| {
        let mut c = StackConfig { name: Some(n.into()), ..StackConfig::default() };
        c.ports.push(PortSpec::new("net_null0").addr("198.18.0.2/24").unwrap());
        c.validate()
    };
    assert!(named("echo-1").is_ok());
    assert!(named("1echo").is_ok());
    assert!(named("123-4").is_err());
    assert!(named("123-x").is_err());
    assert!(named(".hidden").is_err());
}

#[test]
fn lcores() {
    assert_eq!(parse_lcores("1").unwrap(), vec![1]);
    assert_eq!(parse_lcores("0-2,5").unwrap(), vec![0, 1, 2, 5]);
    for bad in ["", "a", "3-1", "0-200", "1,,2"] {
        assert!(parse_lcores(bad).is_err(), "{bad}");
    }
    assert_eq!(lcore_ids("0-1").unwrap(), vec![0, 1]);
    assert_eq!(lcore_ids("1@(0-1)").unwrap(), vec![1]);
    assert_eq!(lcore_ids("2@0,1@(0,1)").unwrap(), vec![1, 2]);
    assert_eq!(lcore_ids("(1-2)@(0-3),4").unwrap(), vec![1, 2, 4]);
    assert_eq!(lcore_ids("1@(200-201)").unwrap(), vec![1], "CPUs past 127");
    assert!(lcore_ids("200@1").is_err(), "lcore ids stay below 128");
    for bad in ["1@", "@1", "1@(0", "1@0,1)", "1@((0))", "1@0,1@1", "1@0,1", "x@1", "1@(a)"] {
        assert!(lcore_ids(bad).is_err(), "{bad}");
    }
}

#[test]
fn toml_config() {
    let c = StackConfig::from_toml(
        r#"
        lcores = "1"
        gateways = ["198.18.0.1"]
        [[ports]]
        device = "net_tap0,iface=spate0"
        ipv4 = ["198.18.0.2/24"]
        ipv6 = ["fd00::2/64"]
        poll = "adaptive"
        "#,
    )
    .unwrap();
    c.validate().unwrap();
    assert_eq!(c.ports[0].ipv4[0].to_string(), "198.18.0.2/24");
    assert_eq!((c.poll, c.ports[0].poll), (PollMode::Busy, Some(PollMode::Adaptive)));
    assert_eq!(c.poll_idle_us, 50, "the default");
    assert_eq!(StackConfig::from_toml("poll_idle_us = 0").unwrap().poll_idle_us, 0);
    assert_eq!(c.mcast_refresh_secs, 60, "the default");
    assert_eq!(StackConfig::from_toml("mcast_refresh_secs = 0").unwrap().mcast_refresh_secs, 0);
    let long = StackConfig { poll_idle_us: 10_001, ..c.clone() };
    assert!(long.validate().unwrap_err().to_string().contains("poll_idle_us = 10001: at most 10000"));
    StackConfig { poll_idle_us: 10_000, ..c.clone() }.validate().unwrap();
    assert!(StackConfig::from_toml("bogus = 1").is_err(), "unknown keys are errors");
    assert_eq!(c.mempool_order, MempoolOrder::Lifo, "the default");
    assert_eq!(StackConfig::from_toml("mempool_order = \"fifo\"").unwrap().mempool_order, MempoolOrder::Fifo);
    assert!(StackConfig::from_toml("mempool_order = \"random\"").is_err());
    let off_link = StackConfig { gateways: vec!["10.0.0.1".parse().unwrap()], ..c.clone() };
    assert!(off_link.validate().unwrap_err().to_string().contains("not on any configured prefix"));
    let no_ports = StackConfig { ports: vec![], ..c };
    assert!(no_ports.validate().is_err());
}

#[test]
fn static_neighbors() {
    let c = StackConfig::from_toml(
        r#"
        [[ports]]
        device = "net_tap0,iface=spate0"
        ipv4 = ["198.18.0.2/24"]
        ipv6 = ["fd00::2/64"]
        neighbors = [{ ip = "198.18.0.1", mac = "02:00:00:00:00:01" }, { ip = "fe80::1", mac = "02:00:00:00:00:01" }]
        "#,
    )
    .unwrap();
    c.validate().unwrap();
    assert_eq!(c.ports[0].neighbors[0].mac, MacAddr([2, 0, 0, 0, 0, 1]));
    let with = |ip: &str, mac: [u8; 6]| {
        let mut p = c.ports[0].clone();
        p.neighbors = vec![StaticNeighbor { ip: ip.parse().unwrap(), mac: MacAddr(mac) }];
        StackConfig { ports: vec![p], ..c.clone() }.validate().map_err(|e| e.to_string())
    };
    assert!(with("10.0.0.1", [2, 0, 0, 0, 0, 1]).unwrap_err().contains("not on any of the port's prefixes"));
    assert!(with("198.18.0.2", [2, 0, 0, 0, 0, 1]).unwrap_err().contains("not on any"), "our own address");
    assert!(with("198.18.0.1", [1, 0, 0, 0, 0, 1]).unwrap_err().contains("not a unicast MAC"));
    assert!(with("198.18.0.1", [0; 6]).unwrap_err().contains("not a unicast MAC"));
    let mut twice = c.ports[0].clone();
    twice.neighbors.push(twice.neighbors[0]);
    let e = StackConfig { ports: vec![twice], ..c.clone() }.validate().unwrap_err().to_string();
    assert!(e.contains("given twice"), "{e}");
    assert!(StackConfig::from_toml("[[ports]]\ndevice = \"x\"\nneighbors = [{ ip = \"1.2.3.4\" }]").is_err());
}

#[test]
fn device_kinds() {
    assert!(PortSpec::new("0000:00:04.0").is_pci());
    assert!(!PortSpec::new("net_tap0,iface=x").is_pci());
    assert_eq!(
        mac_from_device("net_tap0,iface=x,mac=02:53:50:41:54:45"),
        Some(MacAddr([2, 0x53, 0x50, 0x41, 0x54, 0x45]))
    );
}
