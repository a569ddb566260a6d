use super::rules::{format_number, sizes};
use super::*;

fn check(bounds: Bounds, v: f64) -> Result<(), String> {
    bounds.check(v, &format_number)
}

#[test]
fn bounds_follow_protoc_gen_validate_semantics() {
    let port = Bounds {
        lte: Some(65535.0),
        ..Default::default()
    };
    assert_eq!(check(port, 65535.0), Ok(()));
    assert_eq!(
        check(port, 65536.0),
        Err("must be <= 65535 (got 65536)".into())
    );
    // lower < upper: inside the range.
    let status = Bounds {
        gte: Some(200.0),
        lt: Some(600.0),
        ..Default::default()
    };
    assert_eq!(check(status, 200.0), Ok(()));
    assert_eq!(
        check(status, 600.0),
        Err("must be >= 200 and < 600 (got 600)".into())
    );
    // lower >= upper: outside the range.
    let outside = Bounds {
        gt: Some(10.0),
        lt: Some(5.0),
        ..Default::default()
    };
    assert_eq!(check(outside, 4.0), Ok(()));
    assert_eq!(check(outside, 11.0), Ok(()));
    assert_eq!(
        check(outside, 7.0),
        Err("must be > 10 or < 5 (got 7)".into())
    );
    assert_eq!(check(Bounds::default(), -1.0), Ok(()));
    assert_eq!(
        Bounds {
            gt: Some(0.0),
            ..Default::default()
        }
        .check(0.0, &|s| format!("{s}s")),
        Err("must be > 0s (got 0s)".into())
    );
}

#[test]
fn sizes_name_the_unit() {
    assert_eq!(
        sizes(0, Some(1), None, "items"),
        Err("must have at least 1 items (has 0)".into())
    );
    assert_eq!(
        sizes(3, None, Some(2), "bytes"),
        Err("must have at most 2 bytes (has 3)".into())
    );
    assert_eq!(sizes(2, Some(1), Some(2), "items"), Ok(()));
}
