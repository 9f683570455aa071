use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{DrawEntry, DrawSeed, Ticket};

/// Where a ticket lands in the draw: HMAC-SHA256 keyed with the seed's
/// bytes over the ticket's bytes. Comparing these bytes is comparing their
/// lowercase hex (each byte is two digits, and `0-9` sort before `a-f`), so
/// sorting by them is the published rule without formatting any hex.
pub fn place_key(seed: &DrawSeed, ticket: &Ticket) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(seed.as_bytes())
        .expect("HMAC-SHA256 takes a key of any length");
    mac.update(ticket.as_str().as_bytes());
    mac.finalize().into_bytes().into()
}

/// The order of everyone who joined before the start. Two tickets with the
/// same key would need a SHA-256 collision; the ticket breaks that tie
/// anyway, so the order is a function of its inputs whatever they are.
pub fn shuffle(seed: &DrawSeed, tickets: &[Ticket]) -> Vec<Ticket> {
    let mut keyed: Vec<([u8; 32], &Ticket)> = tickets
        .iter()
        .map(|ticket| (place_key(seed, ticket), ticket))
        .collect();
    keyed.sort_unstable();
    keyed
        .into_iter()
        .map(|(_, ticket)| ticket.clone())
        .collect()
}

/// The whole order as it should be published: the drawn entries shuffled,
/// then the late arrivals by join time, then by sequence number.
pub fn draw_order(seed: &DrawSeed, entries: &[DrawEntry]) -> Vec<Ticket> {
    let drawn: Vec<Ticket> = entries
        .iter()
        .filter(|entry| !entry.late)
        .map(|entry| entry.ticket.clone())
        .collect();
    let mut late: Vec<&DrawEntry> = entries.iter().filter(|entry| entry.late).collect();
    late.sort_by_key(|entry| (entry.joined_at, entry.seq));
    let mut order = shuffle(seed, &drawn);
    order.extend(late.into_iter().map(|entry| entry.ticket.clone()));
    order
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{RngCore, SeedableRng};

    use super::*;

    fn ticket(raw: &str) -> Ticket {
        Ticket::parse(raw).unwrap()
    }

    fn counting_seed() -> DrawSeed {
        DrawSeed::from_bytes(std::array::from_fn(|i| i as u8))
    }

    /// Computed with python3, independently of this code:
    ///   seed = bytes(range(32))
    ///   hmac.new(seed, t.encode(), hashlib.sha256).hexdigest() for each t
    ///   sorted(tickets, key=lambda t: (that hexdigest, t))
    const VECTOR: [(&str, &str); 6] = [
        (
            "7K2M9QXH4D",
            "f0cb0184aabcd302186790f845e91a98b5e109fa8ceacd530dec5cafaf435396",
        ),
        (
            "B3TRW8N5ZP",
            "c1403d28d6ba427bb6495f9a1a69aed752d925ac08bba78a54aa7156de2a4963",
        ),
        (
            "0A1B2C3D4E",
            "2aea8795b210f22579a23721b9f9247cb78f62da330d3f16cf8ddd3226541f17",
        ),
        (
            "ZZZZZZZZZZ",
            "4405c762fa5373e55c94e4aeeeb2bee8541d44c48a58bc4fff00f57a317d1702",
        ),
        (
            "QX5V6JM8GR",
            "32f55517df172b3b394f1b74ac480667800d07855c3e11c2750e9e9a3dd5568f",
        ),
        (
            "H6FYS9KCTE",
            "1f093becdace120cc9973b7cb986dffff8b0f92e99f241dfa11d4b684f6b22db",
        ),
    ];
    const VECTOR_ORDER: [&str; 6] = [
        "H6FYS9KCTE",
        "0A1B2C3D4E",
        "QX5V6JM8GR",
        "ZZZZZZZZZZ",
        "B3TRW8N5ZP",
        "7K2M9QXH4D",
    ];

    #[test]
    fn known_answer_vector() {
        let seed = counting_seed();
        for (raw, expected) in VECTOR {
            assert_eq!(
                hex::encode(place_key(&seed, &ticket(raw))),
                expected,
                "{raw}"
            );
        }
        let tickets: Vec<Ticket> = VECTOR.iter().map(|(raw, _)| ticket(raw)).collect();
        let order = shuffle(&seed, &tickets);
        let order: Vec<&str> = order.iter().map(Ticket::as_str).collect();
        assert_eq!(order, VECTOR_ORDER);
    }

    #[test]
    fn the_same_seed_and_tickets_give_the_same_order_whatever_their_listing() {
        let mut rng = StdRng::seed_from_u64(16);
        for _ in 0..50 {
            let seed = random_seed(&mut rng);
            let tickets: Vec<Ticket> = (0..40).map(|_| Ticket::generate()).collect();
            let first = shuffle(&seed, &tickets);
            let mut reversed = tickets.clone();
            reversed.reverse();
            assert_eq!(shuffle(&seed, &tickets), first);
            assert_eq!(shuffle(&seed, &reversed), first);
            assert_eq!(shuffle(&seed.clone(), &tickets), first);
        }
    }

    #[test]
    fn another_seed_gives_another_order() {
        let tickets: Vec<Ticket> = VECTOR.iter().map(|(raw, _)| ticket(raw)).collect();
        let mut rng = StdRng::seed_from_u64(17);
        let orders: std::collections::HashSet<Vec<Ticket>> = (0..20)
            .map(|_| shuffle(&random_seed(&mut rng), &tickets))
            .collect();
        // 20 draws of 720 orders: all alike would mean the seed is ignored.
        assert!(orders.len() > 10, "{}", orders.len());
    }

    #[test]
    fn late_arrivals_follow_by_join_time_then_sequence() {
        let at = |s: &str| s.parse().unwrap();
        let entry = |raw: &str, seq, joined: &str, late| DrawEntry {
            ticket: ticket(raw),
            seq,
            joined_at: at(joined),
            late,
        };
        // Listed out of arrival order on purpose: the order must not
        // depend on how the entries happen to be listed.
        let entries = vec![
            entry("N4PD2WQ7XA", 9, "2026-12-01T10:00:03Z", true),
            entry("7K2M9QXH4D", 1, "2026-12-01T09:45:00Z", false),
            entry("M9CE3RV6SB", 8, "2026-12-01T10:00:01Z", true),
            entry("B3TRW8N5ZP", 2, "2026-12-01T09:46:00Z", false),
            entry("A7A7A7A7A7", 7, "2026-12-01T10:00:01Z", true),
            entry("H6FYS9KCTE", 3, "2026-12-01T09:47:00Z", false),
        ];
        let order = draw_order(&counting_seed(), &entries);
        let names: Vec<&str> = order.iter().map(Ticket::as_str).collect();
        assert_eq!(
            names,
            [
                "H6FYS9KCTE",
                "B3TRW8N5ZP",
                "7K2M9QXH4D",
                "A7A7A7A7A7",
                "M9CE3RV6SB",
                "N4PD2WQ7XA"
            ]
        );
    }

    fn random_seed(rng: &mut StdRng) -> DrawSeed {
        let mut bytes = [0u8; 32];
        rng.fill_bytes(&mut bytes);
        DrawSeed::from_bytes(bytes)
    }

    // --- Uniformity -------------------------------------------------------
    //
    // 5 tickets have 120 orders. 60,000 draws with independent seeds put
    // 500 draws on each order on average; Pearson's chi-square against
    // uniform has 119 degrees of freedom. The test fails above 185.09, the
    // 1e-4 upper quantile of chi-square(119), computed with python3's mpmath:
    //   findroot(lambda x: gammainc(119/2, x/2, inf, regularized=True) - 1e-4, 170)
    // so a fair shuffle fails with probability 1e-4 for a given stream of
    // seeds. The seeds come from StdRng::seed_from_u64(UNIFORMITY_STREAM),
    // so the outcome is the same on every run: it cannot flake, and the 1e-4
    // is the chance that another stream (a new number, or a rand release
    // whose StdRng differs) turns up a false failure. With stream 16 the
    // shuffle scores 111.91; the biased controls score 3,000 and more.

    const DRAWS: usize = 60_000;
    const CRITICAL_1E4_DF119: f64 = 185.09;
    const UNIFORMITY_STREAM: u64 = 16;
    const FIVE: [&str; 5] = [
        "7K2M9QXH4D",
        "B3TRW8N5ZP",
        "0A1B2C3D4E",
        "ZZZZZZZZZZ",
        "QX5V6JM8GR",
    ];

    /// Chi-square of the orders `draw` produces over `draws` seeds. `draw`
    /// returns, for each place in the order, the index of the ticket in it.
    fn chi_square(draws: usize, draw: impl Fn(&DrawSeed, &[Ticket]) -> [usize; 5]) -> f64 {
        let tickets: Vec<Ticket> = FIVE.iter().map(|raw| ticket(raw)).collect();
        let mut rng = StdRng::seed_from_u64(UNIFORMITY_STREAM);
        let mut counts = [0u64; 120];
        for _ in 0..draws {
            counts[permutation_index(draw(&random_seed(&mut rng), &tickets))] += 1;
        }
        let expected = draws as f64 / 120.0;
        counts
            .iter()
            .map(|&n| (n as f64 - expected).powi(2) / expected)
            .sum()
    }

    /// Lehmer code: a distinct number in 0..120 for each order of five.
    fn permutation_index(order: [usize; 5]) -> usize {
        let mut index = 0;
        for i in 0..5 {
            let smaller_after = order[i + 1..].iter().filter(|&&x| x < order[i]).count();
            index = index * (5 - i) + smaller_after;
        }
        index
    }

    fn as_indices(order: &[Ticket], tickets: &[Ticket]) -> [usize; 5] {
        std::array::from_fn(|place| {
            tickets
                .iter()
                .position(|t| t == &order[place])
                .expect("a drawn ticket")
        })
    }

    /// Sorts by a cut-down key, ties by ticket: the bug of comparing too
    /// little of the HMAC.
    fn truncated(bits: u32) -> impl Fn(&DrawSeed, &[Ticket]) -> [usize; 5] {
        move |seed, tickets| {
            let mut order: Vec<usize> = (0..5).collect();
            order.sort_by_key(|&i| (place_key(seed, &tickets[i])[0] >> (8 - bits), i));
            order.try_into().unwrap()
        }
    }

    #[test]
    fn permutation_index_numbers_every_order_once() {
        let mut seen = std::collections::HashSet::new();
        let mut order = [0, 1, 2, 3, 4];
        // Heap's algorithm: all 120 orders.
        fn heap(k: usize, order: &mut [usize; 5], seen: &mut std::collections::HashSet<usize>) {
            if k == 1 {
                seen.insert(permutation_index(*order));
                return;
            }
            for i in 0..k {
                heap(k - 1, order, seen);
                let j = if k.is_multiple_of(2) { i } else { 0 };
                order.swap(j, k - 1);
            }
        }
        heap(5, &mut order, &mut seen);
        assert_eq!(seen.len(), 120);
        assert!(seen.iter().all(|&i| i < 120));
    }

    #[test]
    fn the_shuffle_is_uniform() {
        let statistic = chi_square(DRAWS, |seed, tickets| {
            as_indices(&shuffle(seed, tickets), tickets)
        });
        println!("chi-square of the shuffle over {DRAWS} draws: {statistic:.2}");
        assert!(
            statistic < CRITICAL_1E4_DF119,
            "chi-square {statistic:.2} >= {CRITICAL_1E4_DF119}: the shuffle is not uniform"
        );
    }

    /// Negative controls: the same statistic rejects shuffles known to be biased.
    #[test]
    fn the_uniformity_test_rejects_biased_shuffles() {
        // Ticket order, whatever the seed: one order gets every draw.
        let by_ticket = chi_square(DRAWS, |_, tickets| {
            let mut order: Vec<usize> = (0..5).collect();
            order.sort_by_key(|&i| &tickets[i]);
            order.try_into().unwrap()
        });
        // The first four bits of the key: about half the draws hold a tie.
        let first_nibble = chi_square(DRAWS, truncated(4));
        // The textbook mistake: swap each place with any place (5^5 paths
        // onto 120 orders, which cannot be spread evenly), driven by the seed.
        let naive_swaps = chi_square(DRAWS, |seed, _| {
            let mut order = [0, 1, 2, 3, 4];
            for (i, byte) in seed.as_bytes()[..5].iter().enumerate() {
                order.swap(i, usize::from(*byte) % 5);
            }
            order
        });
        println!(
            "chi-square, biased controls over {DRAWS} draws: by ticket {by_ticket:.0}, \
             first nibble {first_nibble:.0}, naive swaps {naive_swaps:.0}"
        );
        for (name, statistic) in [
            ("by ticket", by_ticket),
            ("first nibble", first_nibble),
            ("naive swaps", naive_swaps),
        ] {
            assert!(
                statistic > CRITICAL_1E4_DF119,
                "{name}: chi-square {statistic:.2} did not reject a biased shuffle"
            );
        }
    }

    /// Sorting by the first byte only ties in about 4% of draws; its excess
    /// over a fair shuffle is about 2.2e-4 per draw (chi-square noncentrality),
    /// too little for 60,000 draws to see (expected statistic about 132;
    /// stream 16 gives 118.83), so this control needs a million (expected
    /// about 339; stream 16 gives 335.61). Slow in a debug build:
    /// `cargo test --release --lib -- --ignored first_byte`.
    #[test]
    #[ignore]
    fn a_million_draws_reject_sorting_by_the_first_byte() {
        let unseen = chi_square(DRAWS, truncated(8));
        println!("chi-square, first byte over {DRAWS} draws: {unseen:.2}");
        let draws = 1_000_000;
        let statistic = chi_square(draws, truncated(8));
        println!("chi-square, first byte over {draws} draws: {statistic:.2}");
        assert!(statistic > CRITICAL_1E4_DF119, "{statistic:.2}");
    }
}
