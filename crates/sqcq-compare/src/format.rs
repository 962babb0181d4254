//! Numbers as the tables (`report`, `scaling`) and the charts (`plot`)
//! print them.

/// `v` rounded, with thousands separators.
pub fn thousands(v: f64) -> String {
    let n = v.round();
    if !n.is_finite() {
        return "-".into();
    }
    let digits = format!("{n:.0}");
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(1234567.4), "1,234,567");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(f64::NAN), "-");
    }
}
