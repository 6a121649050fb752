//! Numbers a caller passes (limits, counts, seeds, digits, timeouts), checked against the range
//! the core takes before any SQL runs: a value out of range is an `Invalid` error that names the
//! argument and the range allowed, never a wrapped-around or saturated number.

use crate::error::{GradeError, Result};

/// An integer as the caller gave it: its value when it fits in i128, else the text it was
/// given as (Python's ints have no bound), kept for the error message.
#[derive(Debug, Clone, PartialEq)]
pub enum Int {
    Fits(i128),
    Huge(String),
}

impl Int {
    /// The value as the caller wrote it, for a message.
    pub fn text(&self) -> String {
        match self {
            Int::Fits(v) => v.to_string(),
            Int::Huge(text) => text.clone(),
        }
    }
}

macro_rules! int_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Int {
            fn from(v: $t) -> Self {
                Int::Fits(v as i128)
            }
        }
    )*};
}
int_from!(u32, u64, usize, i32, i64);

/// The integer types the core takes, with their ranges.
pub trait Ranged: TryFrom<i128> {
    const MIN: i128;
    const MAX: i128;
}

macro_rules! ranged {
    ($($t:ty),*) => {$(
        impl Ranged for $t {
            const MIN: i128 = <$t>::MIN as i128;
            const MAX: i128 = <$t>::MAX as i128;
        }
    )*};
}
ranged!(u32, u64, usize, i32, i64);

/// `value` as a `T` in `lo..=hi` (both within T's own range), or an Invalid error saying
/// "`name` must be an integer from `lo` to `hi`, got ...".
pub fn int_in<T: Ranged>(name: &str, value: &Int, lo: i128, hi: i128) -> Result<T> {
    let (lo, hi) = (lo.max(T::MIN), hi.min(T::MAX));
    if let Int::Fits(v) = value {
        if (lo..=hi).contains(v) {
            if let Ok(t) = T::try_from(*v) {
                return Ok(t);
            }
        }
    }
    Err(GradeError::Invalid(format!(
        "{name} must be an integer from {lo} to {hi}, got {}",
        value.text()
    )))
}

/// `value` as a `T` in T's whole range (`0..=T::MAX` for the unsigned ones).
pub fn int<T: Ranged>(name: &str, value: &Int) -> Result<T> {
    int_in(name, value, T::MIN, T::MAX)
}

/// A number of seconds as the caller gave it: a float, or an int too large for one (its text).
#[derive(Debug, Clone, PartialEq)]
pub enum Seconds {
    Value(f64),
    Huge(String),
}

impl From<f64> for Seconds {
    fn from(v: f64) -> Self {
        Seconds::Value(v)
    }
}

/// A deadline: a positive, finite number of seconds.
pub fn seconds(name: &str, value: &Seconds) -> Result<f64> {
    match value {
        Seconds::Value(s) if s.is_finite() && *s > 0.0 => Ok(*s),
        Seconds::Value(s) => Err(GradeError::Invalid(format!(
            "{name} must be a positive number of seconds, got {s}"
        ))),
        Seconds::Huge(text) => Err(GradeError::Invalid(format!(
            "{name} must be a positive, finite number of seconds, got {text}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message<T: std::fmt::Debug>(r: Result<T>) -> String {
        match r {
            Err(GradeError::Invalid(m)) => m,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn unsigned_arguments_refuse_negatives_and_name_the_range() {
        assert_eq!(int::<usize>("max_rows", &Int::Fits(20)).unwrap(), 20);
        assert_eq!(int::<usize>("max_rows", &Int::Fits(0)).unwrap(), 0);
        assert_eq!(
            message(int::<u32>("max_rows", &Int::Fits(-1))),
            "max_rows must be an integer from 0 to 4294967295, got -1"
        );
        assert_eq!(
            message(int::<u64>("seed", &Int::Fits(1 << 64))),
            "seed must be an integer from 0 to 18446744073709551615, got 18446744073709551616"
        );
        assert_eq!(int::<u64>("seed", &Int::from(u64::MAX)).unwrap(), u64::MAX);
    }

    #[test]
    fn a_narrower_range_and_huge_values() {
        assert_eq!(
            int_in::<u32>("float_digits", &Int::Fits(17), 1, 17).unwrap(),
            17
        );
        assert_eq!(
            message(int_in::<u32>("float_digits", &Int::Fits(0), 1, 17)),
            "float_digits must be an integer from 1 to 17, got 0"
        );
        let huge = Int::Huge("1".to_string() + &"0".repeat(50));
        assert!(message(int::<usize>("count_cap", &huge))
            .ends_with("got 100000000000000000000000000000000000000000000000000"));
        // A range wider than the type is clipped to it.
        assert_eq!(
            message(int_in::<i32>(
                "nice",
                &Int::Fits(1 << 40),
                i128::MIN,
                i128::MAX
            )),
            "nice must be an integer from -2147483648 to 2147483647, got 1099511627776"
        );
        assert_eq!(int::<i64>("bytes", &Int::Fits(-1)).unwrap(), -1);
    }

    #[test]
    fn deadlines_are_positive_and_finite() {
        assert_eq!(seconds("timeout_s", &Seconds::Value(0.5)).unwrap(), 0.5);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(message(seconds("timeout_s", &Seconds::Value(bad)))
                .starts_with("timeout_s must be a positive"));
        }
        assert_eq!(
            message(seconds("timeout_s", &Seconds::Huge("1e400".into()))),
            "timeout_s must be a positive, finite number of seconds, got 1e400"
        );
    }
}
