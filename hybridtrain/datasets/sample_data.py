"""SampleData: the project's deterministic, realistic customer-churn dataset (nothing is downloaded).

``generate_churn(rows, seed)`` builds a frame whose columns are exactly ``schema.columns`` of
``jobs/churn.yaml``; ``write_churn_csv(path, rows, seed)`` writes it byte-for-byte identically
for the same ``(rows, seed)`` so the DVC hash of ``data/raw/churn.csv`` can be pinned.

What is in it, and why:

- **Real-looking PII** (the anonymizer must remove it): names from built-in lists of common UK
  first and last names, emails derived from the name (several patterns, number suffixes, common
  UK providers), UK mobile numbers, dates of birth for ages 18-85, UK-style postcodes
  (outward code, space, inward code). ``account_id``, ``email`` and ``phone`` are unique per
  customer (emails compared case- and whitespace-insensitively).
- **Dirt a cleaning step must handle**: ~0.5% of rows are exact duplicates of another row
  (same ``account_id``), ~0.2% have an empty label, ~2.5% of emails have surrounding whitespace
  or mixed case, ``total_charges`` is missing for new customers (tenure 0) and at random
  (~0.5%), ``satisfaction_score`` is missing for ~12% (survey non-response).
- **A learnable label**: ``churned`` is drawn from a logistic model of tenure, contract, charges,
  support calls, late payments, a latent dissatisfaction (seen through satisfaction score and
  support calls), internet service, payment method, age and products. The churn rate is ~25%
  and a plain logistic regression on the numeric and one-hot features reaches ROC AUC ~0.85.

Everything is vectorized (numpy, pyarrow compute); the only Python loops build fixed lookup
tables (email user names per first/last name) and re-draw the rare colliding email.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from hybridtrain.storage import staging

DEFAULT_ROWS = 200_000
DEFAULT_SEED = 20261121
#: Fewest rows a sample (or each site's part of it) may have: fewer cannot fill 10 % validation and
#: test splits with the 10 rows each that a job spec's ``split.min_rows`` asks for by default.
MIN_ROWS = 100
#: Most rows the CLI generates: every row is held in memory while it is made (about 1 GB per million).
MAX_ROWS = 10_000_000

#: The day the extract was taken: ages, tenures and signup dates are relative to it.
SNAPSHOT = np.datetime64("2026-11-01", "D")
MIN_AGE, MAX_AGE = 18, 85

COLUMNS = (
    "account_id", "full_name", "email", "phone", "date_of_birth", "postcode", "signup_date",
    "region", "contract", "payment_method", "internet_service", "tenure_months",
    "monthly_charges", "total_charges", "support_calls_90d", "late_payments_12m",
    "avg_monthly_gb", "satisfaction_score", "has_streaming", "num_products", "churned",
)  # fmt: skip

DUPLICATE_RATE = 0.005
MISSING_LABEL_RATE = 0.002
MIXED_CASE_EMAIL_RATE = 0.015
PADDED_EMAIL_RATE = 0.01
MISSING_TOTAL_RATE = 0.005
MISSING_SATISFACTION_RATE = 0.12

CONTRACTS = ("month-to-month", "one-year", "two-year")
PAYMENT_METHODS = ("direct-debit", "credit-card", "bank-transfer", "paypal")
INTERNET_SERVICES = ("fibre", "dsl", "none")

# Common UK given names and surnames (ONS / census frequency order, roughly). Popularity
# follows a Zipf-like curve over list position, so "Smith" is far more common than "Moss".
FIRST_NAMES = (
    "Oliver", "Olivia", "George", "Amelia", "Harry", "Isla", "Jack", "Ava", "Jacob", "Emily",
    "Noah", "Sophia", "Charlie", "Grace", "Muhammad", "Mia", "Thomas", "Poppy", "Oscar", "Ella",
    "William", "Lily", "James", "Evie", "Henry", "Isabella", "Leo", "Sophie", "Alfie", "Ivy",
    "Joshua", "Freya", "Freddie", "Harper", "Archie", "Willow", "Ethan", "Charlotte", "Isaac",
    "Jessica", "Alexander", "Chloe", "Joseph", "Daisy", "Edward", "Alice", "Samuel", "Ruby",
    "Max", "Florence", "Daniel", "Lucy", "Arthur", "Rosie", "Lucas", "Matilda", "Mohammed",
    "Phoebe", "Logan", "Evelyn", "David", "Sarah", "John", "Emma", "Michael", "Hannah", "Paul",
    "Rebecca", "Andrew", "Laura", "Mark", "Rachel", "Richard", "Claire", "Peter", "Helen",
    "Stephen", "Nicola", "Christopher", "Karen", "Robert", "Susan", "Ian", "Julie", "Simon",
    "Joanne", "Anthony", "Amanda", "Matthew", "Victoria", "Gareth", "Kerry", "Rhys", "Siobhan",
    "Callum", "Niamh", "Aidan", "Aoife", "Priya", "Arjun", "Fatima", "Omar", "Aisha", "Hamza",
    "Zainab", "Ravi", "Anjali", "Kwame", "Chidi", "Adaeze", "Tomasz", "Agnieszka", "Piotr",
)  # fmt: skip
LAST_NAMES = (
    "Smith", "Jones", "Williams", "Taylor", "Brown", "Davies", "Evans", "Wilson", "Thomas",
    "Johnson", "Roberts", "Robinson", "Thompson", "Wright", "Walker", "White", "Edwards",
    "Hughes", "Green", "Hall", "Lewis", "Harris", "Clarke", "Patel", "Jackson", "Wood",
    "Turner", "Martin", "Cooper", "Hill", "Ward", "Morris", "Moore", "Clark", "Lee", "King",
    "Baker", "Harrison", "Morgan", "Allen", "James", "Scott", "Phillips", "Watson", "Davis",
    "Parker", "Price", "Bennett", "Young", "Griffiths", "Mitchell", "Kelly", "Cook", "Carter",
    "Richardson", "Bailey", "Collins", "Bell", "Shaw", "Murphy", "Miller", "Cox", "Richards",
    "Khan", "Marshall", "Anderson", "Simpson", "Ellis", "Adams", "Singh", "Begum", "Wilkinson",
    "Foster", "Chapman", "Powell", "Webb", "Rogers", "Gray", "Mason", "Ali", "Hunt", "Hussain",
    "Campbell", "Matthews", "Owen", "Palmer", "Holmes", "Mills", "Barnes", "Knight", "Lloyd",
    "Butler", "Russell", "Barker", "Fisher", "Stevens", "Jenkins", "Murray", "Dixon", "Harvey",
    "Graham", "Pearson", "Ahmed", "Fletcher", "Walsh", "Kaur", "Gibson", "Howard", "Andrews",
    "Stewart", "Elliott", "Reynolds", "Saunders", "Payne", "Fox", "Ford", "Pearce", "Day",
    "Brooks", "West", "Lawrence", "Cole", "Atkinson", "Bradley", "Spencer", "Gill", "Dawson",
    "Ball", "Burton", "O'Brien", "Watts", "Rose", "Booth", "Perry", "Ryan", "Grant", "Wells",
    "Armstrong", "Francis", "Rees", "Hayes", "Hart", "Hudson", "Newman", "Barrett", "Webster",
    "Hunter", "Gregory", "Carr", "Lowe", "Page", "Marsh", "Riley", "Dunn", "Woods", "Parsons",
    "Berry", "Stone", "Reid", "Holland", "Hawkins", "Harding", "Porter", "Robertson", "Newton",
    "Oliver", "Reed", "Kennedy", "Williamson", "Bird", "Gardner", "Shah", "Dean", "Lane",
    "Cooke", "Bates", "Henderson", "Parry", "Burgess", "Bishop", "Walton", "Burns", "Nicholson",
    "Shepherd", "Ross", "Cross", "Long", "Freeman", "Warren", "Nicholls", "Hamilton", "Byrne",
    "Sutton", "McDonald", "Yates", "Hodgson", "Robson", "Curtis", "Hopkins", "O'Connor",
    "Harper", "Coleman", "Watkins", "Moss", "McCarthy", "Chambers", "Smith-Jones", "Nowak",
    "Kowalski", "Okafor", "Mensah", "Chen", "Wang", "Nguyen", "Das", "Sharma",
)  # fmt: skip

# Email providers common in the UK, with rough shares.
EMAIL_DOMAINS = (
    ("gmail.com", 0.34), ("outlook.com", 0.12), ("hotmail.co.uk", 0.12), ("yahoo.co.uk", 0.08),
    ("btinternet.com", 0.07), ("icloud.com", 0.08), ("sky.com", 0.05), ("live.co.uk", 0.04),
    ("hotmail.com", 0.05), ("protonmail.com", 0.02), ("aol.co.uk", 0.01), ("virginmedia.com", 0.02),
)  # fmt: skip

# Postcode areas: (area letters, region, relative population, districts in use).
# Districts are numbered 1..N; EC and WC (central London) use lettered sub-districts.
POSTCODE_AREAS = (
    ("E", "London", 6.0, 8), ("N", "London", 5.0, 8), ("NW", "London", 4.0, 6),
    ("SE", "London", 6.0, 9), ("SW", "London", 6.0, 9), ("W", "London", 4.0, 6),
    ("EC", "London", 1.0, 0), ("WC", "London", 0.8, 0),
    ("BN", "South East", 3.0, 3), ("GU", "South East", 2.5, 3), ("RG", "South East", 3.0, 3),
    ("OX", "South East", 2.0, 3), ("ME", "South East", 2.0, 2), ("SO", "South East", 2.5, 3),
    ("PO", "South East", 2.0, 2), ("MK", "South East", 2.0, 2), ("CT", "South East", 1.5, 2),
    ("BS", "South West", 4.0, 4), ("EX", "South West", 2.0, 2), ("PL", "South West", 1.8, 2),
    ("BA", "South West", 1.2, 2), ("GL", "South West", 1.8, 2), ("BH", "South West", 1.8, 2),
    ("CB", "East of England", 2.2, 3), ("NR", "East of England", 2.2, 3),
    ("IP", "East of England", 1.8, 2), ("CM", "East of England", 2.2, 3),
    ("LU", "East of England", 1.4, 2), ("PE", "East of England", 2.0, 2),
    ("B", "West Midlands", 7.0, 9), ("CV", "West Midlands", 2.4, 3),
    ("WV", "West Midlands", 1.8, 2), ("ST", "West Midlands", 2.0, 2),
    ("NG", "East Midlands", 3.0, 4), ("LE", "East Midlands", 3.0, 4),
    ("DE", "East Midlands", 2.2, 3), ("NN", "East Midlands", 1.6, 2),
    ("LS", "Yorkshire and the Humber", 4.0, 5), ("S", "Yorkshire and the Humber", 4.0, 5),
    ("BD", "Yorkshire and the Humber", 2.0, 3), ("YO", "Yorkshire and the Humber", 1.5, 2),
    ("HU", "Yorkshire and the Humber", 1.5, 2),
    ("M", "North West", 6.0, 8), ("L", "North West", 4.0, 6), ("PR", "North West", 1.6, 2),
    ("WA", "North West", 1.8, 2), ("CH", "North West", 1.4, 2), ("SK", "North West", 1.6, 2),
    ("NE", "North East", 4.0, 5), ("SR", "North East", 1.2, 2), ("TS", "North East", 1.8, 2),
    ("DH", "North East", 1.0, 2),
    ("CF", "Wales", 3.0, 4), ("SA", "Wales", 2.0, 3), ("NP", "Wales", 1.4, 2), ("LL", "Wales", 1.2, 2),
    ("G", "Scotland", 6.0, 8), ("EH", "Scotland", 4.0, 5), ("AB", "Scotland", 2.0, 3),
    ("DD", "Scotland", 1.2, 2), ("KY", "Scotland", 1.0, 2), ("IV", "Scotland", 0.6, 1),
    ("BT", "Northern Ireland", 4.0, 5),
)  # fmt: skip
CENTRAL_DISTRICTS = {"EC": ("EC1A", "EC1V", "EC2A", "EC3M", "EC4A"), "WC": ("WC1E", "WC1H", "WC2H", "WC2N")}
REGIONS = (
    "London", "South East", "South West", "East of England", "West Midlands", "East Midlands",
    "Yorkshire and the Humber", "North West", "North East", "Wales", "Scotland", "Northern Ireland",
)  # fmt: skip
# Letters Royal Mail uses in the last two places of an inward code (no C, I, K, M, O, V).
INWARD_LETTERS = tuple("ABDEFGHJLNPQRSTUWXYZ")


def generate_churn(rows: int = DEFAULT_ROWS, seed: int = DEFAULT_SEED) -> pd.DataFrame:
    """The churn dataset as a frame: ``rows`` rows (duplicates included), columns in ``COLUMNS`` order.

    Types: strings use pandas' ``str`` dtype; dates are ``datetime64[s]``; region, contract,
    payment method and internet service are ``category``; ``churned`` is nullable ``Int64``
    (a few labels are missing on purpose); ``has_streaming`` is ``bool``.
    """
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1:
        raise ValueError(f"rows must be a positive integer, got {rows!r}")
    problem = seed_problem(seed)
    if problem:
        raise ValueError(f"seed {problem}")
    rng = np.random.default_rng(seed)
    n_dup = int(round(rows * DUPLICATE_RATE))
    n = rows - n_dup  # distinct customers

    first = _zipf_index(rng, len(FIRST_NAMES), n, 0.6)
    last = _zipf_index(rng, len(LAST_NAMES), n, 0.7)
    first_names, last_names = pa.array(FIRST_NAMES).take(first), pa.array(LAST_NAMES).take(last)
    initials = pa.array(list("ABCDEFGHJKLMNPRST")).take(rng.integers(0, 17, n))
    full_name = pc.if_else(
        pa.array(rng.random(n) < 0.07),
        _join(first_names, " ", initials, ". ", last_names),
        _join(first_names, " ", last_names),
    )

    age_years = _draw_age(rng, n)
    dob = _dob_from_age(age_years)
    age = (SNAPSHOT - dob).astype(np.int64) / 365.2425

    contract = rng.choice(3, n, p=[0.53, 0.21, 0.26])
    mean_tenure = np.array([14.0, 30.0, 46.0])[contract]
    tenure = np.minimum(rng.gamma(1.6, mean_tenure / 1.6).astype(np.int64), 72)
    tenure = np.minimum(tenure, ((age - MIN_AGE) * 12).astype(np.int64))
    signup = SNAPSHOT - (tenure * 30.44 + rng.uniform(0, 30, n)).astype(np.int64).astype("timedelta64[D]")
    signup = np.minimum(np.maximum(signup, dob + np.timedelta64(int(MIN_AGE * 365.2425) + 1, "D")), SNAPSHOT)

    payment = rng.choice(4, n, p=[0.46, 0.24, 0.12, 0.18])
    internet = rng.choice(3, n, p=[0.45, 0.34, 0.21])
    p_stream = np.where(internet == 2, 0.04, np.clip(0.75 - 0.007 * age, 0.1, 0.7))
    streaming = rng.random(n) < p_stream
    num_products = 1 + rng.binomial(3, np.where(contract == 2, 0.35, 0.2))

    monthly = (
        12.0 + np.array([38.0, 22.0, 0.0])[internet] + 11.0 * streaming + 8.5 * (num_products - 1)
        + rng.normal(0, 4.0, n)
    )  # fmt: skip
    monthly = np.round(np.maximum(monthly, 9.99), 2)
    total = np.round(monthly * tenure * rng.uniform(0.96, 1.04, n), 2)
    total[(tenure == 0) | (rng.random(n) < MISSING_TOTAL_RATE)] = np.nan

    gb_scale = np.array([260.0, 110.0, 0.0])[internet] * np.where(streaming, 1.6, 1.0)
    avg_gb = np.round(gb_scale * rng.lognormal(0.0, 0.45, n), 2)

    # Latent dissatisfaction: observed only through support calls and the survey score.
    unhappy = rng.normal(0.0, 1.0, n)
    calls = rng.poisson(np.exp(-0.35 + 0.55 * unhappy + 0.25 * (internet == 0)))
    late = rng.poisson(np.exp(-1.4 + np.array([-0.4, 0.0, 0.2, 0.6])[payment] + 0.3 * unhappy))
    satisfaction = np.clip(np.round(3.6 - 0.8 * unhappy + rng.normal(0.0, 0.6, n)), 1, 5)
    satisfaction[rng.random(n) < MISSING_SATISFACTION_RATE] = np.nan

    logit = (
        -0.85
        - 0.045 * tenure
        + np.array([0.9, -0.5, -1.5])[contract]
        + 0.022 * (monthly - 60.0)
        + 0.28 * calls
        + 0.40 * late
        + 0.75 * unhappy
        + np.array([0.35, 0.0, -0.45])[internet]
        + np.array([-0.2, 0.0, 0.1, 0.35])[payment]
        - 0.018 * (age - 45.0)
        - 0.12 * (num_products - 1)
    )
    churned = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)

    area_idx, district = _draw_districts(rng, n)
    inward = _join(
        _digits(rng.integers(0, 10, n)),
        pa.array(INWARD_LETTERS).take(rng.integers(0, len(INWARD_LETTERS), n)),
        pa.array(INWARD_LETTERS).take(rng.integers(0, len(INWARD_LETTERS), n)),
    )
    region_of_area = np.array([REGIONS.index(r) for _, r, *_ in POSTCODE_AREAS])

    frame = pd.DataFrame(
        {
            "account_id": _text(_join("ACC-", _digits(rng.choice(10**8, n, replace=False), width=8))),
            "full_name": _text(full_name),
            "email": _text(_emails(rng, first, last)),
            "phone": _text(_phones(rng, n)),
            "date_of_birth": dob.astype("datetime64[s]"),
            "postcode": _text(_join(district, " ", inward)),
            "signup_date": signup.astype("datetime64[s]"),
            "region": pd.Categorical.from_codes(region_of_area[area_idx], categories=REGIONS),
            "contract": pd.Categorical.from_codes(contract, categories=CONTRACTS),
            "payment_method": pd.Categorical.from_codes(payment, categories=PAYMENT_METHODS),
            "internet_service": pd.Categorical.from_codes(internet, categories=INTERNET_SERVICES),
            "tenure_months": tenure,
            "monthly_charges": monthly,
            "total_charges": total,
            "support_calls_90d": calls.astype(np.int64),
            "late_payments_12m": late.astype(np.int64),
            "avg_monthly_gb": avg_gb,
            "satisfaction_score": satisfaction,
            "has_streaming": streaming,
            "num_products": num_products.astype(np.int64),
            "churned": pd.array(churned, dtype="Int64"),
        }
    )

    # Dirt, applied before duplication so duplicates are exact copies of a dirty row.
    frame.loc[rng.random(n) < MISSING_LABEL_RATE, "churned"] = pd.NA
    frame["email"] = _dirty_emails(rng, frame["email"])

    if n_dup:
        sources = rng.choice(n, n_dup, replace=False)
        frame = pd.concat([frame, frame.iloc[sources]], ignore_index=True)
    return frame.iloc[rng.permutation(rows)].reset_index(drop=True)


def rows_problem(rows: int, minimum: int = MIN_ROWS) -> str | None:
    """What is wrong with generating ``rows`` rows (``minimum`` to ``MAX_ROWS``), or ``None``."""
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)):
        return f"must be a whole number, got {rows!r}"
    if not minimum <= rows <= MAX_ROWS:
        return f"must be between {minimum:,} and {MAX_ROWS:,}, got {rows:,}"
    return None


def seed_problem(seed: int) -> str | None:
    """What is wrong with ``seed`` as a generator seed (a whole number >= 0, as numpy takes), or ``None``."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        return f"must be a whole number >= 0, got {seed!r}"
    if seed < 0:
        return f"must be a whole number >= 0, got {seed}"
    return None


def write_churn_csv(path: Path | str, rows: int = DEFAULT_ROWS, seed: int = DEFAULT_SEED) -> Path:
    """Write ``generate_churn(rows, seed)`` as CSV, atomically; the same arguments give the same bytes.

    Format: header row, no index, ``\\n`` line endings, UTF-8, floats with two decimals, ISO
    dates, booleans as ``True``/``False``, missing values as empty fields. The file appears only
    when complete (written to a temporary file in the same directory, then renamed over ``path``); a
    temporary a killed writer left there is removed first (``storage.staging``).
    """
    path = Path(path)
    frame = generate_churn(rows, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = staging.staged_file(path.parent, suffix=".csv")  # a killed writer's leftovers go first
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            frame.to_csv(fh, index=False, lineterminator="\n", float_format="%.2f", date_format="%Y-%m-%d")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _join(*parts: pa.Array | str) -> pa.Array:
    """Element-wise concatenation of string arrays and scalars."""
    return pc.binary_join_element_wise(*parts, "")


def _digits(values: np.ndarray, width: int = 0) -> pa.Array:
    text = pc.cast(pa.array(values), pa.string())
    return pc.utf8_lpad(text, width=width, padding="0") if width else text


def _text(values: pa.Array) -> pd.Series:
    return pd.Series(pd.array(values, dtype="str"))


def _zipf_index(rng: np.random.Generator, size: int, n: int, exponent: float) -> np.ndarray:
    """Indices into a popularity-ordered list: position 1 is the most common."""
    weights = 1.0 / np.arange(1, size + 1) ** exponent
    return rng.choice(size, n, p=weights / weights.sum())


def _draw_age(rng: np.random.Generator, n: int) -> np.ndarray:
    """Adult ages in years (fractional), 18 <= age < 86, peaking in the 30s-50s."""
    age = rng.normal(44.0, 15.0, n)
    bad = (age < MIN_AGE) | (age >= MAX_AGE + 1)
    # Out-of-range draws are replaced by uniform ages: keeps the tails populated without a loop.
    age[bad] = rng.uniform(MIN_AGE, MAX_AGE + 1, int(bad.sum()))
    return age


def _dob_from_age(age_years: np.ndarray) -> np.ndarray:
    latest = SNAPSHOT - np.timedelta64(int(MIN_AGE * 365.2425) + 1, "D")  # at least 18 today
    earliest = SNAPSHOT - np.timedelta64(int((MAX_AGE + 1) * 365.2425) - 1, "D")  # at most 85
    days = (age_years * 365.2425).astype(np.int64).astype("timedelta64[D]")
    return np.clip(SNAPSHOT - days, earliest, latest)


def _draw_districts(rng: np.random.Generator, n: int) -> tuple[np.ndarray, pa.Array]:
    """Area index and outward code per customer; lower-numbered districts are more populous."""
    outwards: list[str] = []
    weights: list[float] = []
    area_of: list[int] = []
    for i, (area, _, pop, count) in enumerate(POSTCODE_AREAS):
        names = CENTRAL_DISTRICTS.get(area) or tuple(f"{area}{d}" for d in range(1, count + 1))
        share = 1.0 / np.arange(1, len(names) + 1) ** 0.5
        for name, s in zip(names, share / share.sum(), strict=True):
            outwards.append(name)
            weights.append(pop * s)
            area_of.append(i)
    w = np.array(weights)
    pick = rng.choice(len(outwards), n, p=w / w.sum())
    return np.array(area_of)[pick], pa.array(outwards).take(pick)


def _local_parts() -> pa.Array:
    """Email user names for every (first name, last name, pattern), flattened in that order."""
    out = []
    for f in FIRST_NAMES:
        f = f.lower()
        for last in LAST_NAMES:
            s = last.lower().replace("'", "").replace("-", "")
            out += [f"{f}.{s}", f"{f}{s}", f"{f[0]}.{s}", f"{f}_{s}", f"{s}.{f}", f"{f[0]}{s}"]
    return pa.array(out)


EMAIL_PATTERN_SHARES = (0.34, 0.14, 0.14, 0.08, 0.1, 0.2)


def _emails(rng: np.random.Generator, first: np.ndarray, last: np.ndarray) -> pa.Array:
    n = len(first)
    patterns = len(EMAIL_PATTERN_SHARES)
    pattern = rng.choice(patterns, n, p=EMAIL_PATTERN_SHARES)
    local = _local_parts().take((first * len(LAST_NAMES) + last) * patterns + pattern)
    # Most addresses carry a number: a birth year, a short number or a longer one.
    kind = rng.choice(4, n, p=[0.18, 0.22, 0.38, 0.22])
    number = np.choose(kind, [np.zeros(n, np.int64), rng.integers(1960, 2009, n),
                              rng.integers(1, 100, n), rng.integers(100, 10_000, n)])  # fmt: skip
    suffix = pc.if_else(pa.array(kind == 0), "", _digits(number))
    domains = pa.array([d for d, _ in EMAIL_DOMAINS])
    shares = np.array([s for _, s in EMAIL_DOMAINS])
    domain = domains.take(rng.choice(len(shares), n, p=shares / shares.sum()))
    user = _join(local, suffix)
    # Collisions (two "john.smith@gmail.com"): give later ones extra digits until all are unique.
    while True:
        email = _join(user, "@", domain)
        dup = pd.Series(pd.array(email, dtype="str")).duplicated().to_numpy()
        if not dup.any():
            return email
        extra = pc.if_else(pa.array(dup), _digits(rng.integers(10, 1000, n)), "")
        user = _join(user, extra)


def _phones(rng: np.random.Generator, n: int) -> pa.Array:
    """UK mobiles, unique: ``07xxx xxxxxx`` or ``+44 7xxx xxxxxx``."""
    digits = _digits(7_000_000_000 + rng.choice(10**9, n, replace=False))  # 7 + nine digits
    head, tail = pc.utf8_slice_codeunits(digits, 0, 4), pc.utf8_slice_codeunits(digits, 4, 10)
    return pc.if_else(pa.array(rng.random(n) < 0.3), _join("+44 ", head, " ", tail), _join("0", head, " ", tail))


def _dirty_emails(rng: np.random.Generator, email: pd.Series) -> pd.Series:
    """Some addresses typed in capitals (``JOHN.SMITH@GMAIL.COM``) or title case
    (``John.Smith@Gmail.Com``), some pasted with surrounding spaces or tabs."""
    n = len(email)
    values = pa.array(email.to_numpy(dtype=object), type=pa.string())
    mixed = rng.random(n) < MIXED_CASE_EMAIL_RATE
    upper = rng.integers(0, 2, n) == 0
    values = pc.if_else(pa.array(mixed & upper), pc.utf8_upper(values), values)
    values = pc.if_else(pa.array(mixed & ~upper), pc.utf8_title(values), values)
    padded = rng.random(n) < PADDED_EMAIL_RATE
    pad = pa.array([" ", "  ", "\t", " "]).take(rng.integers(0, 4, n))
    side = rng.integers(0, 3, n)  # leading, trailing, both
    values = pc.if_else(pa.array(padded & (side != 1)), _join(pad, values), values)
    values = pc.if_else(pa.array(padded & (side != 0)), _join(values, pad), values)
    return pd.Series(pd.array(values, dtype="str"), index=email.index)
