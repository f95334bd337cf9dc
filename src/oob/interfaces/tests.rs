use super::*;

fn cidr(s: &str) -> Cidr {
    s.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn cidr_matching() {
    assert!(cidr("10.0.0.0/8").contains(ip("10.255.1.2")));
    assert!(!cidr("10.0.0.0/8").contains(ip("11.0.0.1")));
    assert!(
        cidr("192.168.1.77/24").contains(ip("192.168.1.1")),
        "host bits ignored"
    );
    assert!(cidr("0.0.0.0/0").contains(ip("8.8.8.8")));
    assert!(cidr("1.2.3.4/32").contains(ip("1.2.3.4")));
    assert!(!cidr("1.2.3.4/32").contains(ip("1.2.3.5")));
    assert!(cidr("1.2.3.4").contains(ip("1.2.3.4")));
    assert!(cidr("fe80::/10").contains(ip("fe80::1")));
    assert!(cidr("fe80::/10").contains(ip("febf::1")));
    assert!(!cidr("fe80::/10").contains(ip("fec0::1")));
    assert!(cidr("::/0").contains(ip("2001:db8::1")));
    assert!(cidr("::1/128").contains(ip("::1")));
    assert!(!cidr("::/0").contains(ip("1.2.3.4")), "families never mix");
    assert!(!cidr("0.0.0.0/0").contains(ip("::ffff:1.2.3.4")));
}

#[test]
fn cidr_parse_errors() {
    for bad in [
        "10.0.0.0/33",
        "::/129",
        "10.0.0.0/",
        "10.0.0.0/+8",
        "10.0.0/8",
        "x/8",
        "/8",
    ] {
        assert!(bad.parse::<Cidr>().is_err(), "{bad}");
    }
}

#[test]
fn spec_parse() {
    assert_eq!(IfSpec::parse("eth0").unwrap(), IfSpec::Name("eth0".into()));
    assert_eq!(
        IfSpec::parse("10.0.0.0/8").unwrap(),
        IfSpec::Net(cidr("10.0.0.0/8"))
    );
    assert_eq!(IfSpec::parse("::1").unwrap(), IfSpec::Net(cidr("::1/128")));
    assert!(IfSpec::parse("").is_err());
    assert!(IfSpec::parse("a very long interface name").is_err());
    assert!(IfSpec::parse("10.0.0.0/99").is_err());
}

fn host() -> Vec<IfAddr> {
    let a = |name: &str, s: &str, loopback| IfAddr {
        name: name.into(),
        ip: ip(s),
        prefix: if ip(s).is_ipv4() { 24 } else { 64 },
        loopback,
    };
    vec![
        a("lo", "127.0.0.1", true),
        a("lo", "::1", true),
        a("eth0", "10.1.2.3", false),
        a("eth0", "fe80::1", false),
        a("eth0", "2001:db8::3", false),
        a("ib0", "192.168.7.3", false),
    ]
}

#[test]
fn default_skips_loopback_and_link_local() {
    let got = select_from(&host(), &[], &[], true, true).unwrap();
    assert_eq!(
        got,
        vec![ip("10.1.2.3"), ip("2001:db8::3"), ip("192.168.7.3")]
    );
    let got = select_from(&host(), &[], &[], true, false).unwrap();
    assert_eq!(got, vec![ip("10.1.2.3"), ip("192.168.7.3")]);
}

#[test]
fn only_loopback_present_gives_loopback() {
    let lo_only: Vec<IfAddr> = host().into_iter().filter(|a| a.loopback).collect();
    assert_eq!(
        select_from(&lo_only, &[], &[], true, false).unwrap(),
        vec![ip("127.0.0.1")]
    );
    assert_eq!(
        select_from(&lo_only, &[], &[], true, true).unwrap(),
        vec![ip("127.0.0.1"), ip("::1")]
    );
    // Excluding everything else also leaves loopback.
    let got = select_from(&host(), &[], &strs(&["eth0", "ib0"]), true, false).unwrap();
    assert_eq!(got, vec![ip("127.0.0.1")]);
}

#[test]
fn explicit_include_of_loopback_works() {
    assert_eq!(
        select_from(&host(), &strs(&["lo"]), &[], true, false).unwrap(),
        vec![ip("127.0.0.1")]
    );
    assert_eq!(
        select_from(&host(), &strs(&["127.0.0.0/8"]), &[], true, true).unwrap(),
        vec![ip("127.0.0.1")]
    );
    assert_eq!(
        select_from(&host(), &strs(&["lo", "ib0"]), &[], true, false).unwrap(),
        vec![ip("127.0.0.1"), ip("192.168.7.3")]
    );
}

#[test]
fn include_and_exclude() {
    assert_eq!(
        select_from(&host(), &strs(&["10.0.0.0/8"]), &[], true, true).unwrap(),
        vec![ip("10.1.2.3")]
    );
    assert_eq!(
        select_from(&host(), &strs(&["fe80::/10"]), &[], true, true).unwrap(),
        vec![ip("fe80::1")]
    );
    assert_eq!(
        select_from(&host(), &[], &strs(&["eth0"]), true, true).unwrap(),
        vec![ip("192.168.7.3")]
    );
    assert_eq!(
        select_from(&host(), &[], &strs(&["192.168.0.0/16"]), true, false).unwrap(),
        vec![ip("10.1.2.3")]
    );
}

#[test]
fn errors() {
    assert_eq!(
        select_from(&host(), &strs(&["eth0"]), &strs(&["ib0"]), true, true),
        Err(InterfaceError::BothLists)
    );
    assert!(matches!(
        select_from(&host(), &strs(&["nope0"]), &[], true, true),
        Err(InterfaceError::NoAddress { .. })
    ));
    assert!(matches!(
        select_from(&host(), &strs(&["10.0.0.0/8"]), &[], false, true),
        Err(InterfaceError::NoAddress { .. })
    ));
    assert!(matches!(
        select_from(&host(), &strs(&["1.2.3.4/40"]), &[], true, true),
        Err(InterfaceError::BadEntry { .. })
    ));
    assert!(matches!(
        select_from(&[], &[], &[], true, true),
        Err(InterfaceError::NoAddress { .. })
    ));
}

#[test]
fn this_host_has_an_address() {
    // Normally at least loopback is up; a namespace with nothing up has nothing to test.
    if local_interfaces().unwrap().is_empty() {
        return;
    }
    let got = select_addresses(&[], &[], true, false).unwrap();
    assert!(!got.is_empty());
    if let Ok(lo) = select_addresses(&strs(&["127.0.0.0/8"]), &[], true, false) {
        assert!(lo.iter().all(|a| a.is_loopback()));
    }
}

#[test]
fn networks_carry_their_interfaces_prefix() {
    let nets = networks_of(
        &host(),
        &[ip("10.1.2.3"), ip("2001:db8::3"), ip("192.0.2.9")],
    );
    assert_eq!(nets[0], "10.1.2.3/24".parse::<Cidr>().unwrap());
    assert_eq!(nets[1], "2001:db8::3/64".parse::<Cidr>().unwrap());
    // Not an interface's: a network of its own.
    assert_eq!(nets[2], "192.0.2.9/32".parse::<Cidr>().unwrap());
}

#[test]
fn a_peers_addresses_on_a_shared_network_come_first() {
    let sa = |s: &str| -> SocketAddr { s.parse().unwrap() };
    let local: Vec<Cidr> = vec![
        "10.78.0.5/16".parse().unwrap(),
        "fd00::5/64".parse().unwrap(),
    ];
    let peer = [
        sa("192.0.2.1:7000"),
        sa("10.77.0.2:7000"),
        sa("[fd00::9]:7000"),
        sa("10.78.0.2:7000"),
    ];
    assert_eq!(
        order_by_reach(&peer, &local),
        vec![
            sa("[fd00::9]:7000"),
            sa("10.78.0.2:7000"),
            sa("192.0.2.1:7000"),
            sa("10.77.0.2:7000"),
        ]
    );
    // Nothing shared: the peer's own order.
    assert_eq!(order_by_reach(&peer, &[]), peer.to_vec());
    // The bulk networks first (a direct link), or last (a tree link).
    let bulk: Vec<Cidr> = vec!["10.77.0.0/16".parse().unwrap()];
    assert_eq!(
        prefer(&peer, &bulk, true),
        vec![
            sa("10.77.0.2:7000"),
            sa("192.0.2.1:7000"),
            sa("[fd00::9]:7000"),
            sa("10.78.0.2:7000"),
        ]
    );
    assert_eq!(
        prefer(&peer, &bulk, false),
        vec![
            sa("192.0.2.1:7000"),
            sa("[fd00::9]:7000"),
            sa("10.78.0.2:7000"),
            sa("10.77.0.2:7000"),
        ]
    );
    assert_eq!(prefer(&peer, &[], false), peer.to_vec());
}
