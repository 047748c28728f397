//! Money (SPEC 23.1): a model's prices, held exactly as integer pico-dollars (p$), and
//! the cost of an event in integer micro-dollars (µ$) computed from them.
//!
//! A price of `x` dollars per million tokens is `round(x × 10^6)` p$ per token, a
//! price per request `round(x × 10^12)` p$; an event's cost in µ$ is the ceiling of
//! its p$ divided by 10^6. Every cost is worked out in `i128` and must fit an `i64` of
//! µ$, else [`Error::Overflow`]: no float ever touches a cost.
use crate::core::error::{Error, Result};

/// p$ per µ$ (and p$ per token per dollar per million tokens).
const PICO_PER_MICRO: i128 = 1_000_000;
/// p$ per dollar.
const PICO_PER_DOLLAR: f64 = 1e12;
/// p$ per token for one dollar per million tokens.
const PICO_PER_DOLLAR_PER_MILLION: f64 = 1e6;

/// A model's prices (SPEC 23.1), in p$: per token of each kind, and per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Prices {
    /// p$ per input token (cache reads excluded).
    pub input: i64,
    /// p$ per output token.
    pub output: i64,
    /// p$ per cached input token (a cache read).
    pub cached_input: i64,
    /// p$ per request.
    pub per_request: i64,
}

/// `round(x × scale)` as an exact integer of p$: a negative, NaN or infinite `x` is
/// [`Error::Invalid`], a result beyond `i64` [`Error::Overflow`]. Rounds half to even,
/// as Python's `round`.
fn pico(what: &str, x: f64, scale: f64, unit: &str) -> Result<i64> {
    let per = if unit == "dollars per request" { "pico-dollars" } else { "pico-dollars per token" };
    exact(what, x, scale, unit, per)
}

/// `round(x × scale)` (half to even, as Python's `round`) as an exact `i64` of `held`,
/// from a finite `x >= 0` in `unit`: the one conversion of a float amount of money.
fn exact(what: &str, x: f64, scale: f64, unit: &str, held: &str) -> Result<i64> {
    if !x.is_finite() || x < 0.0 {
        return Err(Error::invalid(format!("{what} must be a finite number >= 0 ({unit}), got {x:?}")));
    }
    let v = (x * scale).round_ties_even();
    // 2^63, the first value beyond i64 (exact as an f64; an infinite product too).
    if v >= 9_223_372_036_854_775_808.0 {
        return Err(Error::Overflow(format!("{what} = {x:?} {unit} is beyond 2^63 - 1 {held}")));
    }
    Ok(v as i64)
}

/// The ceiling of `p` p$ in µ$, as an `i64` (`p >= 0`); [`Error::Overflow`] beyond it.
fn micro(p: i128) -> Result<i64> {
    let m = (p + PICO_PER_MICRO - 1).div_euclid(PICO_PER_MICRO);
    i64::try_from(m).map_err(|_| Error::Overflow("a cost beyond 2^63 - 1 micro-dollars".to_string()))
}

impl Prices {
    /// From dollars per million tokens and dollars per request, as SPEC 23.1 writes
    /// them: `cached_input` `None` is `input`.
    pub fn from_dollars(
        input: f64, output: f64, cached_input: Option<f64>, per_request: f64,
    ) -> Result<Prices> {
        const PER_M: &str = "dollars per million tokens";
        let input_p = pico("input", input, PICO_PER_DOLLAR_PER_MILLION, PER_M)?;
        Ok(Prices {
            input: input_p,
            output: pico("output", output, PICO_PER_DOLLAR_PER_MILLION, PER_M)?,
            cached_input: match cached_input {
                Some(c) => pico("cached_input", c, PICO_PER_DOLLAR_PER_MILLION, PER_M)?,
                None => input_p,
            },
            per_request: pico("per_request", per_request, PICO_PER_DOLLAR, "dollars per request")?,
        })
    }

    /// The input price as held, in dollars per million tokens (p$ / 10^6).
    pub fn input_dollars(&self) -> f64 {
        self.input as f64 / PICO_PER_DOLLAR_PER_MILLION
    }

    /// The output price as held, in dollars per million tokens.
    pub fn output_dollars(&self) -> f64 {
        self.output as f64 / PICO_PER_DOLLAR_PER_MILLION
    }

    /// The cached input price as held, in dollars per million tokens.
    pub fn cached_input_dollars(&self) -> f64 {
        self.cached_input as f64 / PICO_PER_DOLLAR_PER_MILLION
    }

    /// The price per request as held, in dollars (p$ / 10^12).
    pub fn per_request_dollars(&self) -> f64 {
        self.per_request as f64 / PICO_PER_DOLLAR
    }

    /// The cost of a request in µ$ (SPEC 23.1: `record_request`, a lease's success).
    pub fn request_cost(&self) -> Result<i64> {
        micro(i128::from(self.per_request))
    }

    /// The cost in µ$ of `input` input tokens of which `cached` were cache reads, and
    /// `output` output tokens: `(i − min(c, i)) × input + min(c, i) × cached_input + o ×
    /// output` p$, rounded up. Cached above input counts as all of the input (SPEC 14.4).
    pub fn tokens_cost(&self, input: i64, cached: i64, output: i64) -> Result<i64> {
        let (i, c, o) = (
            counted("input_tokens", input)?,
            counted("cached_tokens", cached)?,
            counted("output_tokens", output)?,
        );
        let c = c.min(i);
        micro(
            (i - c) * i128::from(self.input)
                + c * i128::from(self.cached_input)
                + o * i128::from(self.output),
        )
    }

    /// The cost in µ$ of `tokens` given only as a total: `t × max(input, output)` p$,
    /// rounded up.
    pub fn total_cost(&self, tokens: i64) -> Result<i64> {
        micro(counted("tokens", tokens)? * i128::from(self.input.max(self.output)))
    }

    /// What a lease reserves (SPEC 23.1): the worst case of its estimate, the cost of
    /// one request plus that of a token event of `estimated - estimated_output` input
    /// and `estimated_output` output tokens, each rounded up on its own.
    pub fn reservation(&self, estimated: i64, estimated_output: i64) -> Result<i64> {
        counted("estimated_tokens", estimated)?;
        counted("estimated_output_tokens", estimated_output)?;
        if estimated_output > estimated {
            return Err(Error::invalid(format!(
                "estimated_output_tokens ({estimated_output}) must not exceed estimated_tokens ({estimated})"
            )));
        }
        let tokens = self.tokens_cost(estimated - estimated_output, 0, estimated_output)?;
        self.request_cost()?
            .checked_add(tokens)
            .ok_or_else(|| Error::Overflow("a reservation beyond 2^63 - 1 micro-dollars".to_string()))
    }
}

/// µ$ per dollar.
const MICRO_PER_DOLLAR: f64 = 1e6;

/// An amount of dollars as µ$, `round(amount × 10^6)` (half to even, as Python's
/// `round`): a `cost` limit's `limit` (SPEC 23.1, `Limit.dollars`). A negative, NaN or
/// infinite amount is [`Error::Invalid`], one beyond `i64` µ$ [`Error::Overflow`].
pub fn micro_dollars(what: &str, amount: f64) -> Result<i64> {
    exact(what, amount, MICRO_PER_DOLLAR, "dollars", "micro-dollars")
}

/// A count of tokens as an `i128`; a negative one is [`Error::Invalid`].
fn counted(what: &str, n: i64) -> Result<i128> {
    if n < 0 {
        return Err(Error::invalid(format!("{what} must be >= 0, got {n}")));
    }
    Ok(i128::from(n))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn dollars_of_a_cost_limit_are_rounded_micro_dollars() {
        assert_eq!(micro_dollars("amount", 5.0).unwrap(), 5_000_000);
        assert_eq!(micro_dollars("amount", 0.0000005).unwrap(), 0); // half to even
        assert_eq!(micro_dollars("amount", 0.0000015).unwrap(), 2);
        assert_eq!(micro_dollars("amount", 1.23456789).unwrap(), 1_234_568);
        for bad in [-0.01, f64::NAN, f64::INFINITY] {
            assert!(matches!(micro_dollars("amount", bad), Err(Error::Invalid(_))), "{bad}");
        }
        assert!(matches!(micro_dollars("amount", 1e13), Err(Error::Overflow(_))));
    }

    fn prices(input: f64, output: f64, cached: Option<f64>, per_request: f64) -> Prices {
        Prices::from_dollars(input, output, cached, per_request).unwrap()
    }

    #[test]
    fn dollars_are_held_as_pico_dollars_and_read_back() {
        let p = prices(0.15, 0.6, Some(0.075), 0.0);
        assert_eq!(p, Prices { input: 150_000, output: 600_000, cached_input: 75_000, per_request: 0 });
        assert_eq!(
            (p.input_dollars(), p.output_dollars(), p.cached_input_dollars(), p.per_request_dollars()),
            (0.15, 0.6, 0.075, 0.0)
        );
        // Per request: 10^12 p$ per dollar.
        let p = prices(0.0, 0.0, None, 0.002);
        assert_eq!((p.per_request, p.per_request_dollars()), (2_000_000_000, 0.002));
        // Below a p$ per token: rounded to the nearest p$, read back as held.
        let p = prices(0.0000004, 1.0000006, None, 0.0);
        assert_eq!((p.input, p.output), (0, 1_000_001));
        assert_eq!((p.input_dollars(), p.output_dollars()), (0.0, 1.000001));
        // Half a p$ rounds to even, as Python's round().
        assert_eq!(prices(0.0000005, 0.0000015, None, 0.0).input, 0);
        assert_eq!(prices(0.0000005, 0.0000015, None, 0.0).output, 2);
    }

    #[test]
    fn cached_input_defaults_to_input_and_per_request_to_nothing() {
        let p = prices(3.0, 15.0, None, 0.0);
        assert_eq!(p.cached_input, p.input);
        assert_eq!(p.cached_input, 3_000_000);
        assert_eq!(p.per_request, 0);
        // Zero is a price (free), not "unset".
        assert_eq!(prices(3.0, 15.0, Some(0.0), 0.0).cached_input, 0);
        assert_eq!(Prices::default().request_cost().unwrap(), 0);
    }

    #[test]
    fn a_negative_nan_or_infinite_price_is_invalid() {
        for bad in [-0.01, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1e-300] {
            let cases = [
                Prices::from_dollars(bad, 1.0, None, 0.0),
                Prices::from_dollars(1.0, bad, None, 0.0),
                Prices::from_dollars(1.0, 1.0, Some(bad), 0.0),
                Prices::from_dollars(1.0, 1.0, None, bad),
            ];
            for (i, r) in cases.into_iter().enumerate() {
                assert!(matches!(r, Err(Error::Invalid(_))), "{bad} in field {i}: {r:?}");
            }
        }
        // -0.0 is zero.
        assert_eq!(prices(-0.0, 0.0, None, -0.0), Prices::default());
    }

    #[test]
    fn a_price_beyond_i64_pico_dollars_overflows() {
        // 2^63 p$ per token is 9_223_372_036_854.775808 $/M.
        for (input, per_request) in [(9.3e12, 0.0), (1e300, 0.0), (0.0, 9.3e6), (0.0, f64::MAX)] {
            let r = Prices::from_dollars(input, 0.0, None, per_request);
            assert!(matches!(r, Err(Error::Overflow(_))), "{input} {per_request}: {r:?}");
        }
        // Just below: held.
        assert_eq!(prices(9.2e12, 0.0, None, 9.2e6).input, 9_200_000_000_000_000_000);
        assert_eq!(prices(9.2e12, 0.0, None, 9.2e6).per_request, 9_200_000_000_000_000_000);
    }

    #[test]
    fn a_request_costs_its_price_rounded_up_to_a_micro_dollar() {
        assert_eq!(prices(1.0, 1.0, None, 0.002).request_cost().unwrap(), 2_000);
        // 1 p$ is already a whole µ$ of cost.
        assert_eq!(Prices { per_request: 1, ..Prices::default() }.request_cost().unwrap(), 1);
        assert_eq!(Prices { per_request: 1_000_000, ..Prices::default() }.request_cost().unwrap(), 1);
        assert_eq!(Prices { per_request: 1_000_001, ..Prices::default() }.request_cost().unwrap(), 2);
        assert_eq!(Prices::default().request_cost().unwrap(), 0);
    }

    #[test]
    fn tokens_with_a_split_cost_each_kind_at_its_price() {
        // $3/M input, $15/M output, $0.30/M cached: 3_000_000, 15_000_000, 300_000 p$.
        let p = prices(3.0, 15.0, Some(0.3), 0.0);
        // 1000 input of which 400 cached, 200 output:
        // 600 × 3e6 + 400 × 3e5 + 200 × 15e6 = 1.8e9 + 1.2e8 + 3e9 = 4.92e9 p$ = 4920 µ$.
        assert_eq!(p.tokens_cost(1000, 400, 200).unwrap(), 4_920);
        // Cached above input counts as all of the input, none of it above.
        assert_eq!(p.tokens_cost(100, 500, 0).unwrap(), p.tokens_cost(100, 100, 0).unwrap());
        assert_eq!(p.tokens_cost(100, 500, 0).unwrap(), 30);
        // Nothing cached, no output.
        assert_eq!(p.tokens_cost(1, 0, 0).unwrap(), 3);
        // Each event is rounded up: one token at 0.15 $/M is 150_000 p$, 0.15 µ$ -> 1 µ$.
        let cheap = prices(0.15, 0.6, None, 0.0);
        assert_eq!(cheap.tokens_cost(1, 0, 0).unwrap(), 1);
        assert_eq!(cheap.tokens_cost(7, 0, 0).unwrap(), 2); // 1.05 µ$
        assert_eq!(cheap.tokens_cost(20, 0, 0).unwrap(), 3); // exactly 3 µ$
        assert_eq!(cheap.tokens_cost(0, 0, 0).unwrap(), 0);
        // No float drift: a million tokens at 0.1 $/M is exactly 100_000 µ$.
        assert_eq!(prices(0.1, 0.1, None, 0.0).tokens_cost(1_000_000, 0, 0).unwrap(), 100_000);
        assert_eq!(prices(0.1, 0.1, None, 0.0).tokens_cost(3_000_000, 0, 0).unwrap(), 300_000);
    }

    #[test]
    fn a_bare_total_costs_the_dearer_price() {
        let p = prices(3.0, 15.0, Some(0.3), 0.0);
        assert_eq!(p.total_cost(1000).unwrap(), 15_000);
        let q = prices(15.0, 3.0, None, 0.0);
        assert_eq!(q.total_cost(1000).unwrap(), 15_000);
        // Rounded up.
        assert_eq!(prices(0.15, 0.1, None, 0.0).total_cost(1).unwrap(), 1);
        assert_eq!(Prices::default().total_cost(1_000_000).unwrap(), 0);
    }

    #[test]
    fn a_reservation_is_a_request_and_the_estimate_each_rounded_up() {
        let p = prices(3.0, 15.0, Some(0.3), 0.0015);
        // 1_500_000_000 p$ = 1500 µ$; 800 input × 3e6 + 200 output × 15e6 = 5.4e9 p$ = 5400 µ$.
        assert_eq!(p.reservation(1000, 200).unwrap(), 1_500 + 5_400);
        // The cached price never lowers a reservation: the estimate is all input.
        assert_eq!(p.reservation(1000, 0).unwrap(), 1_500 + 3_000);
        // Rounded up separately: 1 p$ per request and 1 token at 1 p$ are 2 µ$, not 1.
        let tiny = Prices { input: 1, output: 1, cached_input: 1, per_request: 1 };
        assert_eq!(tiny.reservation(1, 0).unwrap(), 2);
        assert_eq!(tiny.reservation(0, 0).unwrap(), 1);
        assert_eq!(Prices::default().reservation(1_000_000, 10).unwrap(), 0);
        // As the two events it stands for.
        assert_eq!(
            p.reservation(1000, 200).unwrap(),
            p.request_cost().unwrap() + p.tokens_cost(800, 0, 200).unwrap()
        );
        assert!(matches!(p.reservation(10, 11), Err(Error::Invalid(_))));
        assert!(matches!(p.reservation(-1, 0), Err(Error::Invalid(_))));
    }

    #[test]
    fn a_cost_beyond_i64_micro_dollars_overflows() {
        let max = Prices { input: i64::MAX, output: i64::MAX, cached_input: i64::MAX, per_request: i64::MAX };
        // The widest p$ of one request is a fine µ$.
        assert_eq!(max.request_cost().unwrap(), (i64::MAX / 1_000_000) + 1);
        for r in [
            max.tokens_cost(i64::MAX, 0, i64::MAX),
            max.tokens_cost(i64::MAX, i64::MAX, 0),
            max.total_cost(i64::MAX),
            max.total_cost(2_000_000),
            max.reservation(i64::MAX, 1),
        ] {
            assert!(matches!(r, Err(Error::Overflow(_))), "{r:?}");
        }
        // Just within: (2^63 - 1) µ$ is (2^63 - 1) × 10^6 p$.
        let p = Prices { input: 1_000_000, ..Prices::default() };
        assert_eq!(p.tokens_cost(i64::MAX, 0, 0).unwrap(), i64::MAX);
        assert_eq!(p.total_cost(i64::MAX).unwrap(), i64::MAX);
        // A reservation whose two parts fit but whose sum does not.
        let q = Prices { input: 1_000_000, output: 1_000_000, cached_input: 0, per_request: 1_000_000 };
        assert!(matches!(q.reservation(i64::MAX, 0), Err(Error::Overflow(_))));
    }

    #[test]
    fn negative_counts_are_invalid() {
        let p = prices(1.0, 1.0, None, 0.0);
        assert!(matches!(p.tokens_cost(-1, 0, 0), Err(Error::Invalid(_))));
        assert!(matches!(p.tokens_cost(0, -1, 0), Err(Error::Invalid(_))));
        assert!(matches!(p.tokens_cost(0, 0, -1), Err(Error::Invalid(_))));
        assert!(matches!(p.total_cost(-1), Err(Error::Invalid(_))));
    }
}
