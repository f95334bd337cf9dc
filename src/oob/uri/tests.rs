use super::*;
use proptest::prelude::*;

fn uri(s: &str) -> ContactUri {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

#[test]
fn parses_prrte_shape() {
    let u = uri("tbon.3;tcp://10.0.0.1,10.0.0.2:4000;tcp6://[fe80::1%2],[::1]:4001");
    assert_eq!(u.dvm_id, "tbon");
    assert_eq!(u.rank, 3);
    assert_eq!(
        u.addrs,
        vec![
            "10.0.0.1:4000".parse().unwrap(),
            "10.0.0.2:4000".parse().unwrap(),
            "[fe80::1%2]:4001".parse().unwrap(),
            "[::1]:4001".parse().unwrap(),
        ]
    );
    assert_eq!(
        u.to_string(),
        "tbon.3;tcp://10.0.0.1,10.0.0.2:4000;tcp6://[fe80::1%2],[::1]:4001"
    );
}

#[test]
fn dvm_id_may_contain_dots() {
    let u = uri("prte.job.42.7;tcp://127.0.0.1:1");
    assert_eq!((u.dvm_id.as_str(), u.rank), ("prte.job.42", 7));
    // A dot after the first ';' does not count.
    let u = uri("a.0;tcp://1.2.3.4:5");
    assert_eq!((u.dvm_id.as_str(), u.rank), ("a", 0));
}

#[test]
fn display_keeps_order_across_mixed_ports() {
    let u = ContactUri {
        dvm_id: "d".into(),
        rank: 1,
        addrs: vec![
            "1.1.1.1:10".parse().unwrap(),
            "[::2]:10".parse().unwrap(),
            "3.3.3.3:10".parse().unwrap(),
            "4.4.4.4:11".parse().unwrap(),
        ],
    };
    let s = u.to_string();
    assert_eq!(
        s,
        "d.1;tcp://1.1.1.1:10;tcp6://[::2]:10;tcp://3.3.3.3:10;tcp://4.4.4.4:11"
    );
    assert_eq!(uri(&s), u);
}

#[test]
fn malformed_inputs_are_refused_with_a_reason() {
    let long = format!("d.1;tcp://{}1.1.1.1:1", "1.1.1.1,".repeat(600));
    let cases = [
        "",
        "tbon.3",
        "tbon3;tcp://1.2.3.4:5",
        ".3;tcp://1.2.3.4:5",
        "tbon.;tcp://1.2.3.4:5",
        "tbon.-3;tcp://1.2.3.4:5",
        "tbon.+3;tcp://1.2.3.4:5",
        "tbon.4294967296;tcp://1.2.3.4:5",
        "tbon.3;",
        "tbon.3;tcp://1.2.3.4:5;",
        "tbon.3;udp://1.2.3.4:5",
        "tbon.3;tcp://1.2.3.4",
        "tbon.3;tcp://:5",
        "tbon.3;tcp://1.2.3.4:0",
        "tbon.3;tcp://1.2.3.4:65536",
        "tbon.3;tcp://1.2.3.4,:5",
        "tbon.3;tcp://::1:5",
        "tbon.3;tcp://[::1]:5",
        "tbon.3;tcp6://::1:5",
        "tbon.3;tcp6://[1.2.3.4]:5",
        "tbon.3;tcp6://[::1%eth0]:5",
        "tbon.3;tcp6://[::1:5",
        long.as_str(),
    ];
    for c in cases {
        let e = c.parse::<ContactUri>().expect_err(c);
        assert!(
            e.to_string().starts_with("invalid contact URI: "),
            "{c}: {e}"
        );
    }
}

fn socket_addr() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<u32>(), 1u16..).prop_map(|(ip, p)| SocketAddr::V4(SocketAddrV4::new(ip.into(), p))),
        (any::<u128>(), 1u16.., prop_oneof![Just(0u32), any::<u32>()])
            .prop_map(|(ip, p, s)| SocketAddr::V6(SocketAddrV6::new(ip.into(), p, 0, s))),
    ]
}

proptest! {
    #[test]
    fn round_trips(
        dvm_id in "[A-Za-z0-9._-]{1,24}",
        rank in any::<u32>(),
        addrs in proptest::collection::vec(socket_addr(), 1..8),
    ) {
        let u = ContactUri { dvm_id, rank, addrs };
        let s = u.to_string();
        prop_assert_eq!(s.parse::<ContactUri>(), Ok(u));
    }

    #[test]
    fn random_strings_never_panic(s in ".{0,80}") {
        let _ = s.parse::<ContactUri>();
    }

    #[test]
    fn near_miss_strings_never_panic(s in "[a-z0-9.;:/,\\[\\]%]{0,60}") {
        if let Ok(u) = s.parse::<ContactUri>() {
            // Whatever parses, prints as something that parses to the same value.
            prop_assert_eq!(u.to_string().parse::<ContactUri>(), Ok(u));
        }
    }
}
