//! Exact decimal amounts of CPU and memory.
//!
//! The specifications give CPU and memory as decimals (`cpu 0.5`,
//! `memoryGb 1.5`). Summing floating-point values over thousands of grants
//! and releases drifts, and "counters equal the sum of active leases" must
//! hold exactly, so amounts are kept as integer thousandths.

use std::fmt;
use std::ops::{Add, Sub};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::FieldError;

/// A non-negative decimal with three fractional digits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Amount(u64);

/// Largest amount accepted from input: a million units.
const MAX_THOUSANDTHS: u64 = 1_000_000 * 1000;

impl Amount {
    /// Zero.
    pub const ZERO: Amount = Amount(0);

    /// Whole units.
    pub const fn units(n: u64) -> Amount {
        Amount(n * 1000)
    }

    /// Thousandths of a unit.
    pub const fn from_thousandths(n: u64) -> Amount {
        Amount(n)
    }

    /// The raw thousandths.
    pub const fn thousandths(self) -> u64 {
        self.0
    }

    /// From a decimal given by a caller: finite, not negative, at most a
    /// million, rounded to thousandths.
    pub fn parse(field: &str, value: f64) -> Result<Amount, FieldError> {
        if !value.is_finite() {
            return Err(FieldError::new(field, "must be a finite number"));
        }
        if value < 0.0 {
            return Err(FieldError::new(field, format!("{value} is negative")));
        }
        let scaled = value * 1000.0;
        let thousandths = scaled.round();
        // Amounts are whole thousandths: a value that is not one would be
        // stored as another (1e-300 as 0), so it is refused instead.
        if value > 0.0 && thousandths == 0.0 {
            return Err(FieldError::new(
                field,
                format!("{value:e} is smaller than 0.001, the smallest amount"),
            ));
        }
        if (scaled - thousandths).abs() > 1e-6 * thousandths.max(1.0) {
            return Err(FieldError::new(
                field,
                format!(
                    "{value} has more than three decimal places; amounts are counted in thousandths"
                ),
            ));
        }
        if thousandths > MAX_THOUSANDTHS as f64 {
            return Err(FieldError::new(
                field,
                format!("{value} is larger than 1000000"),
            ));
        }
        Ok(Amount(thousandths as u64))
    }

    /// As a float, for display and utilisation ratios.
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }

    /// `self × n`.
    pub fn times(self, n: u32) -> Amount {
        Amount(self.0.saturating_mul(u64::from(n)))
    }

    /// `self − other`, or zero.
    pub fn saturating_sub(self, other: Amount) -> Amount {
        Amount(self.0.saturating_sub(other.0))
    }

    /// `self / other`, as a ratio (0 when `other` is zero).
    pub fn ratio(self, other: Amount) -> f64 {
        if other.0 == 0 {
            0.0
        } else {
            self.0 as f64 / other.0 as f64
        }
    }

    /// How many `per` it takes to cover `self`, rounded up.
    pub fn div_ceil(self, per: Amount) -> u64 {
        if per.0 == 0 {
            0
        } else {
            self.0.div_ceil(per.0)
        }
    }
}

impl Add for Amount {
    type Output = Amount;
    fn add(self, other: Amount) -> Amount {
        Amount(self.0.saturating_add(other.0))
    }
}

impl Sub for Amount {
    type Output = Amount;
    /// Panics in debug builds on underflow: accounting must never go below
    /// zero, and a bug that tries should be loud in tests.
    fn sub(self, other: Amount) -> Amount {
        debug_assert!(self.0 >= other.0, "amount underflow: {self} - {other}");
        Amount(self.0.saturating_sub(other.0))
    }
}

impl std::iter::Sum for Amount {
    fn sum<I: Iterator<Item = Amount>>(iter: I) -> Amount {
        iter.fold(Amount::ZERO, |a, b| a + b)
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / 1000;
        let frac = self.0 % 1000;
        if frac == 0 {
            write!(f, "{whole}")
        } else {
            let digits = format!("{frac:03}");
            write!(f, "{whole}.{}", digits.trim_end_matches('0'))
        }
    }
}

/// In the API's schemas: a non-negative number in thousandths, inline.
impl utoipa::PartialSchema for Amount {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::Number)
            .minimum(Some(0))
            .into()
    }
}

impl utoipa::ToSchema for Amount {}

impl Serialize for Amount {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Stored and shown as a number; thousandths print exactly.
        s.serialize_f64(self.as_f64())
    }
}

impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Amount, D::Error> {
        let v = f64::deserialize(d)?;
        Amount::parse("amount", v).map_err(|e| serde::de::Error::custom(e.reason))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_are_exact_where_floats_drift() {
        let tenth = Amount::parse("cpu", 0.1).unwrap();
        let total: Amount = std::iter::repeat_n(tenth, 10_000).sum();
        assert_eq!(total, Amount::units(1000));
        let mut float = 0.0f64;
        for _ in 0..10_000 {
            float += 0.1;
        }
        assert_ne!(float, 1000.0, "the reason this type exists");
    }

    #[test]
    fn values_that_are_not_whole_thousandths_are_refused() {
        let e = Amount::parse("limit", 1e-300).unwrap_err();
        assert_eq!(e.field, "limit");
        assert!(e.reason.contains("smaller than 0.001"), "{}", e.reason);
        let e = Amount::parse("cpu", 0.0015).unwrap_err();
        assert!(e.reason.contains("three decimal places"), "{}", e.reason);
        for fine in [0.0, 0.001, 0.1, 0.3, 2.675, 999_999.999, 1e6] {
            assert!(Amount::parse("cpu", fine).is_ok(), "{fine}");
        }
    }

    #[test]
    fn parsing_names_the_field_and_display_is_minimal() {
        assert_eq!(Amount::parse("cpu", 1.5).unwrap().to_string(), "1.5");
        assert_eq!(Amount::parse("cpu", 2.0).unwrap().to_string(), "2");
        assert_eq!(Amount::parse("cpu", 0.125).unwrap().to_string(), "0.125");
        let err = Amount::parse("memoryGb", -1.0).unwrap_err();
        assert_eq!(err.field, "memoryGb");
        assert!(Amount::parse("cpu", f64::NAN).is_err());
        assert!(Amount::parse("cpu", 1e7).is_err());
        assert_eq!(Amount::units(3).div_ceil(Amount::units(2)), 2);
    }
}
