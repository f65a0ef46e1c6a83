"""travel_booking_1: a travel site (flights, seats, travelers, bookings, loyalty, hotels)."""

from functools import partial

from awm.scenarios.verifier_kit import (
    ANSWER_TEXT,
    DIFF_ROWS,
    MENTIONS_AMOUNT,
    NUMBERS,
    ONLY_CHANGED,
    SAME_MONEY,
    TABLE_BY_ID,
    UNCHANGED_BY_DIFF,
    prelude,
    verifier,
)

NAME = "travel_booking_1"

DESCRIPTION = (
    "SkyNest is an online travel site where a signed-in customer plans trips for the family and for work. "
    "The flight catalogue lists scheduled flights of two airlines, Nordic Air and Atlantic Blue, with a "
    "flight number, origin and destination airport codes, departure and arrival times, a base fare per "
    "passenger and a status (scheduled, delayed or cancelled). Every flight has a seat map: each seat has a "
    "label such as 14C, a cabin (economy, premium or business), a position (window, middle or aisle) and a "
    "seat selection fee; a seat is free unless a confirmed booking holds it, so seats of cancelled bookings "
    "are released. The customer keeps saved traveler profiles (name as in the passport, date of birth, "
    "passport number) and books flights for them: a booking has a six-character confirmation code, one or "
    "more passengers with optional seats, a total price made of fares and seat fees, and can be credited to "
    "one of the customer's airline loyalty accounts, but only for the program of the flight's own airline. "
    "Passengers can be added to an existing booking, moved to another free seat, and whole bookings can be "
    "cancelled. Loyalty memberships (airline and hotel programs) show member numbers, tiers and points "
    "balances. Hotel reservations record the hotel, city, check-in date, number of nights, room type, "
    "number of guests, nightly rate and a confirmation number; they can be created, changed (dates, nights, "
    "room type, guests) and cancelled. Typical work: finding seats, booking and rebooking flights, fixing "
    "mistaken or duplicate bookings, seating a family together, crediting miles and adjusting hotel stays."
)

TABLES = [
    {
        "name": "users",
        "ddl": (
            "CREATE TABLE users (id INTEGER PRIMARY KEY, full_name TEXT NOT NULL, email TEXT NOT NULL UNIQUE, "
            "home_airport TEXT, created_at DATETIME DEFAULT CURRENT_TIMESTAMP);"
        ),
        "indexes": [],
    },
    {
        "name": "travelers",
        "ddl": (
            "CREATE TABLE travelers (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, first_name TEXT NOT NULL, "
            "last_name TEXT NOT NULL, date_of_birth DATE NOT NULL, passport_number TEXT, "
            "created_at DATETIME DEFAULT CURRENT_TIMESTAMP, updated_at DATETIME DEFAULT CURRENT_TIMESTAMP, "
            "FOREIGN KEY (user_id) REFERENCES users(id));"
        ),
        "indexes": ["CREATE INDEX ix_travelers_user_id ON travelers(user_id);"],
    },
    {
        "name": "flights",
        "ddl": (
            "CREATE TABLE flights (id INTEGER PRIMARY KEY, flight_number TEXT NOT NULL, airline TEXT NOT NULL, "
            "origin TEXT NOT NULL, destination TEXT NOT NULL, departure_time DATETIME NOT NULL, "
            "arrival_time DATETIME NOT NULL, base_fare REAL NOT NULL CHECK (base_fare >= 0), "
            "status TEXT NOT NULL DEFAULT 'scheduled' CHECK (status IN ('scheduled', 'delayed', 'cancelled')), "
            "CHECK (origin <> destination));"
        ),
        "indexes": [
            "CREATE INDEX idx_flights_route_departure ON flights(origin, destination, departure_time);",
            "CREATE INDEX idx_flights_number ON flights(flight_number);",
        ],
    },
    {
        "name": "seats",
        "ddl": (
            "CREATE TABLE seats (id INTEGER PRIMARY KEY, flight_id INTEGER NOT NULL, seat_number TEXT NOT NULL, "
            "cabin TEXT NOT NULL CHECK (cabin IN ('economy', 'premium', 'business')), "
            "position TEXT NOT NULL CHECK (position IN ('window', 'middle', 'aisle')), "
            "extra_fee REAL NOT NULL DEFAULT 0, UNIQUE (flight_id, seat_number), "
            "FOREIGN KEY (flight_id) REFERENCES flights(id));"
        ),
        "indexes": ["CREATE INDEX idx_seats_flight ON seats(flight_id);"],
    },
    {
        "name": "loyalty_accounts",
        "ddl": (
            "CREATE TABLE loyalty_accounts (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, "
            "program_name TEXT NOT NULL, program_type TEXT NOT NULL CHECK (program_type IN ('airline', 'hotel')), "
            "airline TEXT, member_number TEXT NOT NULL UNIQUE, "
            "points_balance INTEGER NOT NULL DEFAULT 0 CHECK (points_balance >= 0), tier TEXT, "
            "created_at DATETIME DEFAULT CURRENT_TIMESTAMP, FOREIGN KEY (user_id) REFERENCES users(id));"
        ),
        "indexes": ["CREATE INDEX ix_loyalty_accounts_user_id ON loyalty_accounts(user_id);"],
    },
    {
        "name": "bookings",
        "ddl": (
            "CREATE TABLE bookings (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, flight_id INTEGER NOT NULL, "
            "confirmation_code TEXT NOT NULL UNIQUE, "
            "status TEXT NOT NULL DEFAULT 'confirmed' CHECK (status IN ('confirmed', 'cancelled')), "
            "total_price REAL NOT NULL DEFAULT 0, loyalty_account_id INTEGER, "
            "created_at DATETIME DEFAULT CURRENT_TIMESTAMP, updated_at DATETIME DEFAULT CURRENT_TIMESTAMP, "
            "FOREIGN KEY (user_id) REFERENCES users(id), FOREIGN KEY (flight_id) REFERENCES flights(id), "
            "FOREIGN KEY (loyalty_account_id) REFERENCES loyalty_accounts(id));"
        ),
        "indexes": [
            "CREATE INDEX idx_bookings_user_status ON bookings(user_id, status);",
            "CREATE INDEX idx_bookings_flight ON bookings(flight_id);",
        ],
    },
    {
        "name": "booking_passengers",
        "ddl": (
            "CREATE TABLE booking_passengers (id INTEGER PRIMARY KEY, booking_id INTEGER NOT NULL, "
            "traveler_id INTEGER NOT NULL, seat_id INTEGER, created_at DATETIME DEFAULT CURRENT_TIMESTAMP, "
            "UNIQUE (booking_id, traveler_id), FOREIGN KEY (booking_id) REFERENCES bookings(id), "
            "FOREIGN KEY (traveler_id) REFERENCES travelers(id), FOREIGN KEY (seat_id) REFERENCES seats(id));"
        ),
        "indexes": ["CREATE INDEX idx_booking_passengers_seat ON booking_passengers(seat_id);"],
    },
    {
        "name": "hotel_reservations",
        "ddl": (
            "CREATE TABLE hotel_reservations (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, "
            "hotel_name TEXT NOT NULL, city TEXT NOT NULL, check_in_date DATE NOT NULL, "
            "nights INTEGER NOT NULL CHECK (nights > 0), room_type TEXT NOT NULL, "
            "guests INTEGER NOT NULL CHECK (guests > 0), nightly_rate REAL NOT NULL CHECK (nightly_rate >= 0), "
            "status TEXT NOT NULL DEFAULT 'confirmed' CHECK (status IN ('confirmed', 'cancelled')), "
            "confirmation_number TEXT UNIQUE, created_at DATETIME DEFAULT CURRENT_TIMESTAMP, "
            "updated_at DATETIME DEFAULT CURRENT_TIMESTAMP, FOREIGN KEY (user_id) REFERENCES users(id));"
        ),
        "indexes": ["CREATE INDEX idx_hotel_reservations_user_city ON hotel_reservations(user_id, city);"],
    },
]

SAMPLE = [
    {
        "table_name": "users",
        "reasoning": "The signed-in customer (user 1) and another customer whose bookings hold seats too.",
        "insert_statements": [
            "INSERT INTO users (id, full_name, email, home_airport, created_at) VALUES (1, 'Lena Chen', 'lena.chen@example.com', 'CPH', datetime('now', '-700 days'));",
            "INSERT INTO users (id, full_name, email, home_airport, created_at) VALUES (2, 'Oscar Lindqvist', 'oscar.lindqvist@example.com', 'OSL', datetime('now', '-300 days'));",
        ],
    },
    {
        "table_name": "travelers",
        "reasoning": "Saved profiles of user 1 (herself, daughter Maya, husband Ethan) and user 2's own profile.",
        "insert_statements": [
            "INSERT INTO travelers (id, user_id, first_name, last_name, date_of_birth, passport_number, created_at, updated_at) VALUES (1, 1, 'Lena', 'Chen', '1986-02-11', 'P4410923', datetime('now', '-690 days'), datetime('now', '-690 days'));",
            "INSERT INTO travelers (id, user_id, first_name, last_name, date_of_birth, passport_number, created_at, updated_at) VALUES (2, 1, 'Maya', 'Chen', '2012-06-30', 'P5521876', datetime('now', '-500 days'), datetime('now', '-500 days'));",
            "INSERT INTO travelers (id, user_id, first_name, last_name, date_of_birth, passport_number, created_at, updated_at) VALUES (3, 1, 'Ethan', 'Chen', '1984-09-03', 'P6632018', datetime('now', '-500 days'), datetime('now', '-120 days'));",
            "INSERT INTO travelers (id, user_id, first_name, last_name, date_of_birth, passport_number, created_at, updated_at) VALUES (4, 2, 'Oscar', 'Lindqvist', '1979-12-01', 'N9087731', datetime('now', '-290 days'), datetime('now', '-290 days'));",
        ],
    },
    {
        "table_name": "flights",
        "reasoning": "Upcoming flights; NA 311 and NA 315 fly the same CPH-LHR route on consecutive days, NA 209 is cancelled.",
        "insert_statements": [
            "INSERT INTO flights (id, flight_number, airline, origin, destination, departure_time, arrival_time, base_fare, status) VALUES (1, 'NA 208', 'Nordic Air', 'OSL', 'CPH', datetime('now', '+6 days', 'start of day', '+7 hours', '+10 minutes'), datetime('now', '+6 days', 'start of day', '+8 hours', '+25 minutes'), 129.00, 'scheduled');",
            "INSERT INTO flights (id, flight_number, airline, origin, destination, departure_time, arrival_time, base_fare, status) VALUES (2, 'NA 311', 'Nordic Air', 'CPH', 'LHR', datetime('now', '+10 days', 'start of day', '+9 hours'), datetime('now', '+10 days', 'start of day', '+10 hours', '+55 minutes'), 189.00, 'scheduled');",
            "INSERT INTO flights (id, flight_number, airline, origin, destination, departure_time, arrival_time, base_fare, status) VALUES (3, 'NA 315', 'Nordic Air', 'CPH', 'LHR', datetime('now', '+11 days', 'start of day', '+9 hours'), datetime('now', '+11 days', 'start of day', '+10 hours', '+55 minutes'), 179.00, 'scheduled');",
            "INSERT INTO flights (id, flight_number, airline, origin, destination, departure_time, arrival_time, base_fare, status) VALUES (4, 'AB 77', 'Atlantic Blue', 'LHR', 'JFK', datetime('now', '+14 days', 'start of day', '+11 hours', '+30 minutes'), datetime('now', '+14 days', 'start of day', '+19 hours', '+40 minutes'), 549.00, 'scheduled');",
            "INSERT INTO flights (id, flight_number, airline, origin, destination, departure_time, arrival_time, base_fare, status) VALUES (5, 'AB 78', 'Atlantic Blue', 'JFK', 'LHR', datetime('now', '+24 days', 'start of day', '+18 hours', '+45 minutes'), datetime('now', '+25 days', 'start of day', '+6 hours', '+50 minutes'), 529.00, 'scheduled');",
            "INSERT INTO flights (id, flight_number, airline, origin, destination, departure_time, arrival_time, base_fare, status) VALUES (6, 'NA 420', 'Nordic Air', 'OSL', 'LIS', datetime('now', '+29 days', 'start of day', '+12 hours'), datetime('now', '+29 days', 'start of day', '+16 hours', '+20 minutes'), 210.00, 'delayed');",
            "INSERT INTO flights (id, flight_number, airline, origin, destination, departure_time, arrival_time, base_fare, status) VALUES (7, 'NA 209', 'Nordic Air', 'CPH', 'OSL', datetime('now', '+9 days', 'start of day', '+17 hours'), datetime('now', '+9 days', 'start of day', '+18 hours', '+10 minutes'), 119.00, 'cancelled');",
        ],
    },
    {
        "table_name": "seats",
        "reasoning": "Seat maps: NA 208 has four economy window seats (two held by confirmed bookings, one released by a cancelled booking); both CPH-LHR flights have a seat 9F; AB 77 has row 14 for the family.",
        "insert_statements": [
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (1, 1, '2A', 'business', 'window', 180.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (2, 1, '12A', 'economy', 'window', 15.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (3, 1, '12B', 'economy', 'middle', 0.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (4, 1, '12C', 'economy', 'aisle', 10.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (5, 1, '14A', 'economy', 'window', 15.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (6, 1, '14B', 'economy', 'middle', 0.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (7, 1, '14C', 'economy', 'aisle', 10.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (8, 1, '18F', 'economy', 'window', 15.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (9, 1, '20A', 'economy', 'window', 15.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (10, 2, '9D', 'economy', 'aisle', 10.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (11, 2, '9F', 'economy', 'window', 15.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (12, 3, '9E', 'economy', 'middle', 0.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (13, 3, '9F', 'economy', 'window', 15.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (14, 4, '3A', 'business', 'window', 600.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (15, 4, '14A', 'economy', 'window', 25.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (16, 4, '14B', 'economy', 'middle', 0.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (17, 4, '14C', 'economy', 'aisle', 20.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (18, 4, '14D', 'economy', 'aisle', 20.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (19, 4, '22A', 'economy', 'window', 25.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (20, 5, '22C', 'economy', 'aisle', 20.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (21, 5, '22D', 'economy', 'aisle', 20.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (22, 5, '23A', 'economy', 'window', 25.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (23, 6, '8A', 'economy', 'window', 15.00);",
            "INSERT INTO seats (id, flight_id, seat_number, cabin, position, extra_fee) VALUES (24, 7, '5A', 'economy', 'window', 15.00);",
        ],
    },
    {
        "table_name": "loyalty_accounts",
        "reasoning": "Two airline programs and one hotel program of user 1 (the hotel one has the most points); user 2's account has even more points but is not hers.",
        "insert_statements": [
            "INSERT INTO loyalty_accounts (id, user_id, program_name, program_type, airline, member_number, points_balance, tier, created_at) VALUES (1, 1, 'Nordic Air EuroBonus', 'airline', 'Nordic Air', 'EB-55120873', 48210, 'Silver', datetime('now', '-680 days'));",
            "INSERT INTO loyalty_accounts (id, user_id, program_name, program_type, airline, member_number, points_balance, tier, created_at) VALUES (2, 1, 'Atlantic Blue Voyager', 'airline', 'Atlantic Blue', 'ABV-330918', 61450, 'Gold', datetime('now', '-400 days'));",
            "INSERT INTO loyalty_accounts (id, user_id, program_name, program_type, airline, member_number, points_balance, tier, created_at) VALUES (3, 1, 'Stayway Rewards', 'hotel', NULL, 'SW-7781204', 73200, 'Platinum', datetime('now', '-650 days'));",
            "INSERT INTO loyalty_accounts (id, user_id, program_name, program_type, airline, member_number, points_balance, tier, created_at) VALUES (4, 2, 'Nordic Air EuroBonus', 'airline', 'Nordic Air', 'EB-99002211', 120000, 'Gold', datetime('now', '-280 days'));",
        ],
    },
    {
        "table_name": "bookings",
        "reasoning": "Family trip LHR-JFK (QX7K2P) and return (LM4R9T) without miles credited; ZP3W8N was booked yesterday on the wrong day; a confirmed and a cancelled NA 208 booking of user 1 and one NA 208 booking of user 2.",
        "insert_statements": [
            "INSERT INTO bookings (id, user_id, flight_id, confirmation_code, status, total_price, loyalty_account_id, created_at, updated_at) VALUES (1, 1, 4, 'QX7K2P', 'confirmed', 1697.00, NULL, datetime('now', '-20 days'), datetime('now', '-20 days'));",
            "INSERT INTO bookings (id, user_id, flight_id, confirmation_code, status, total_price, loyalty_account_id, created_at, updated_at) VALUES (2, 1, 5, 'LM4R9T', 'confirmed', 549.00, NULL, datetime('now', '-20 days'), datetime('now', '-20 days'));",
            "INSERT INTO bookings (id, user_id, flight_id, confirmation_code, status, total_price, loyalty_account_id, created_at, updated_at) VALUES (3, 1, 2, 'ZP3W8N', 'confirmed', 204.00, NULL, datetime('now', '-1 days'), datetime('now', '-1 days'));",
            "INSERT INTO bookings (id, user_id, flight_id, confirmation_code, status, total_price, loyalty_account_id, created_at, updated_at) VALUES (4, 1, 1, 'HT5B1C', 'confirmed', 144.00, 1, datetime('now', '-12 days'), datetime('now', '-12 days'));",
            "INSERT INTO bookings (id, user_id, flight_id, confirmation_code, status, total_price, loyalty_account_id, created_at, updated_at) VALUES (5, 1, 1, 'RW2N6J', 'cancelled', 144.00, NULL, datetime('now', '-15 days'), datetime('now', '-13 days'));",
            "INSERT INTO bookings (id, user_id, flight_id, confirmation_code, status, total_price, loyalty_account_id, created_at, updated_at) VALUES (6, 2, 1, 'OL8E3M', 'confirmed', 144.00, 4, datetime('now', '-9 days'), datetime('now', '-9 days'));",
        ],
    },
    {
        "table_name": "booking_passengers",
        "reasoning": "Passengers and seats: Lena 14A, Maya 14B and Ethan 22A on AB 77; Lena 22C on AB 78; Ethan 9F on NA 311; NA 208 seats 20A and 14A are held, 18F belongs to the cancelled booking.",
        "insert_statements": [
            "INSERT INTO booking_passengers (id, booking_id, traveler_id, seat_id, created_at) VALUES (1, 1, 1, 15, datetime('now', '-20 days'));",
            "INSERT INTO booking_passengers (id, booking_id, traveler_id, seat_id, created_at) VALUES (2, 1, 2, 16, datetime('now', '-20 days'));",
            "INSERT INTO booking_passengers (id, booking_id, traveler_id, seat_id, created_at) VALUES (3, 1, 3, 19, datetime('now', '-20 days'));",
            "INSERT INTO booking_passengers (id, booking_id, traveler_id, seat_id, created_at) VALUES (4, 2, 1, 20, datetime('now', '-20 days'));",
            "INSERT INTO booking_passengers (id, booking_id, traveler_id, seat_id, created_at) VALUES (5, 3, 3, 11, datetime('now', '-1 days'));",
            "INSERT INTO booking_passengers (id, booking_id, traveler_id, seat_id, created_at) VALUES (6, 4, 1, 9, datetime('now', '-12 days'));",
            "INSERT INTO booking_passengers (id, booking_id, traveler_id, seat_id, created_at) VALUES (7, 5, 1, 8, datetime('now', '-15 days'));",
            "INSERT INTO booking_passengers (id, booking_id, traveler_id, seat_id, created_at) VALUES (8, 6, 4, 5, datetime('now', '-9 days'));",
        ],
    },
    {
        "table_name": "hotel_reservations",
        "reasoning": "Hotel stays: Lisbon, the Amsterdam stay entered twice (the second one yesterday), Zermatt, a cancelled London night, and user 2's Lisbon stay.",
        "insert_statements": [
            "INSERT INTO hotel_reservations (id, user_id, hotel_name, city, check_in_date, nights, room_type, guests, nightly_rate, status, confirmation_number, created_at, updated_at) VALUES (1, 1, 'Harbor View Hotel', 'Lisbon', date('now', '+30 days'), 3, 'double', 2, 145.00, 'confirmed', 'HV-20931', datetime('now', '-10 days'), datetime('now', '-10 days'));",
            "INSERT INTO hotel_reservations (id, user_id, hotel_name, city, check_in_date, nights, room_type, guests, nightly_rate, status, confirmation_number, created_at, updated_at) VALUES (2, 1, 'Canal House Hotel', 'Amsterdam', date('now', '+45 days'), 2, 'double', 2, 168.00, 'confirmed', 'CH-55102', datetime('now', '-2 days'), datetime('now', '-2 days'));",
            "INSERT INTO hotel_reservations (id, user_id, hotel_name, city, check_in_date, nights, room_type, guests, nightly_rate, status, confirmation_number, created_at, updated_at) VALUES (3, 1, 'Canal House Hotel', 'Amsterdam', date('now', '+45 days'), 2, 'double', 2, 168.00, 'confirmed', 'CH-55187', datetime('now', '-1 days'), datetime('now', '-1 days'));",
            "INSERT INTO hotel_reservations (id, user_id, hotel_name, city, check_in_date, nights, room_type, guests, nightly_rate, status, confirmation_number, created_at, updated_at) VALUES (4, 1, 'Alpine Lodge', 'Zermatt', date('now', '+60 days'), 4, 'suite', 3, 310.00, 'confirmed', 'AL-30415', datetime('now', '-25 days'), datetime('now', '-25 days'));",
            "INSERT INTO hotel_reservations (id, user_id, hotel_name, city, check_in_date, nights, room_type, guests, nightly_rate, status, confirmation_number, created_at, updated_at) VALUES (5, 1, 'Riverside Inn', 'London', date('now', '+10 days'), 1, 'single', 1, 119.00, 'cancelled', 'RI-11873', datetime('now', '-30 days'), datetime('now', '-5 days'));",
            "INSERT INTO hotel_reservations (id, user_id, hotel_name, city, check_in_date, nights, room_type, guests, nightly_rate, status, confirmation_number, created_at, updated_at) VALUES (6, 2, 'Harbor View Hotel', 'Lisbon', date('now', '+30 days'), 3, 'double', 2, 145.00, 'confirmed', 'HV-20977', datetime('now', '-8 days'), datetime('now', '-8 days'));",
        ],
    },
]

# ---------------------------------------------------------------------------
# verifiers: self-contained functions, verifier_kit's helpers inlined before each check()
# ---------------------------------------------------------------------------

_verifier = partial(verifier, prelude(
    '''tables = ["users", "travelers", "flights", "seats", "loyalty_accounts", "bookings",
          "booking_passengers", "hotel_reservations"]''',
    TABLE_BY_ID, DIFF_ROWS, UNCHANGED_BY_DIFF, NUMBERS, ONLY_CHANGED))


V_MAYA_SEAT = _verifier(r'''
# info: Maya Chen sits in 14B on QX7K2P (Lena has 14A, Ethan 22A)
if not final_answer or not re.search(r"\b14\s*B\b", final_answer, re.IGNORECASE):
    return False
return unchanged(*tables)
''')

V_TOP_LOYALTY = _verifier(r'''
# info: Stayway Rewards with 73,200 points (user 2's 120,000 are not the user's)
if not final_answer or "stayway" not in final_answer.lower():
    return False
if not any(abs(n - 73200) < 0.5 for n in numbers(final_answer)):
    return False
return unchanged(*tables)
''')

V_FREE_WINDOWS = _verifier(r'''
# info: free economy window seats on NA 208 = 12A and 18F (14A and 20A are held by
# confirmed bookings, 18F was released by a cancelled booking) -> 2
if not final_answer:
    return False
values = {int(n) for n in numbers(final_answer) if n == int(n)}
has_two = 2 in values or re.search(r"\btwo\b", final_answer, re.IGNORECASE) is not None
if not has_two:
    return False
if {1, 3, 4, 6} & values:
    return False
return unchanged(*tables)
''')

V_BOOK_MAYA = _verifier(r'''
b_added, b_removed, b_changed = diff("bookings")
if b_removed or b_changed or len(b_added) != 1:
    return False
bk = b_added[0]
if bk["user_id"] != 1 or bk["flight_id"] != 1 or bk["status"] != "confirmed":
    return False
p_added, p_removed, p_changed = diff("booking_passengers")
if p_removed or p_changed or len(p_added) != 1:
    return False
bp = p_added[0]
# seat 2 = 12A on flight 1 (NA 208); traveler 2 = Maya Chen
if bp["booking_id"] != bk["id"] or bp["traveler_id"] != 2 or bp["seat_id"] != 2:
    return False
return unchanged("users", "travelers", "flights", "seats", "loyalty_accounts", "hotel_reservations")
''')

V_ADD_JONAS = _verifier(r'''
t_added, t_removed, t_changed = diff("travelers")
if t_removed or t_changed or len(t_added) != 1:
    return False
tv = t_added[0]
if tv["user_id"] != 1 or tv["first_name"].strip().lower() != "jonas" or tv["last_name"].strip().lower() != "berg":
    return False
if str(tv["date_of_birth"])[:10] != "1988-04-17" or (tv["passport_number"] or "").strip().upper() != "P7733190":
    return False
b_added, b_removed, b_changed = diff("bookings")
if b_added or b_removed or set(b_changed) - {2}:
    return False
for before, after in b_changed.values():
    if not only_changed(before, after, {"total_price"}):
        return False
p_added, p_removed, p_changed = diff("booking_passengers")
if p_removed or p_changed or len(p_added) != 1:
    return False
bp = p_added[0]
# booking 2 = LM4R9T on AB 78; seat 21 = 22D on that flight
if bp["booking_id"] != 2 or bp["traveler_id"] != tv["id"] or bp["seat_id"] != 21:
    return False
return unchanged("users", "flights", "seats", "loyalty_accounts", "hotel_reservations")
''')

V_MOVE_ETHAN = _verifier(r'''
p_added, p_removed, p_changed = diff("booking_passengers")
if p_added or p_removed or set(p_changed) != {3}:
    return False
before, after = p_changed[3]
# passenger row 3 = Ethan on QX7K2P; seat 17 = 14C on AB 77
if after["seat_id"] != 17 or not only_changed(before, after, {"seat_id"}):
    return False
b_added, b_removed, b_changed = diff("bookings")
if b_added or b_removed or set(b_changed) - {1}:
    return False
for b_before, b_after in b_changed.values():
    if not only_changed(b_before, b_after, {"total_price"}):
        return False
return unchanged("users", "travelers", "flights", "seats", "loyalty_accounts", "hotel_reservations")
''')

V_EXTEND_ALPINE = _verifier(r'''
added, removed, changed = diff("hotel_reservations")
if added or removed or set(changed) != {4}:
    return False
before, after = changed[4]
if after["nights"] != 5 or after["guests"] != 4 or after["status"] != "confirmed":
    return False
if not only_changed(before, after, {"nights", "guests"}):
    return False
return unchanged("users", "travelers", "flights", "seats", "loyalty_accounts", "bookings",
                 "booking_passengers")
''')

V_CREDIT_MILES = _verifier(r'''
# both Atlantic Blue bookings (QX7K2P = 1, LM4R9T = 2) credited to Atlantic Blue Voyager (2)
added, removed, changed = diff("bookings")
if added or removed or set(changed) != {1, 2}:
    return False
for before, after in changed.values():
    if after["loyalty_account_id"] != 2 or not only_changed(before, after, {"loyalty_account_id"}):
        return False
return unchanged("users", "travelers", "flights", "seats", "loyalty_accounts", "booking_passengers",
                 "hotel_reservations")
''')

V_REBOOK_ETHAN = _verifier(r'''
# ZP3W8N (booking 3, NA 311) must be cancelled and exactly one new confirmed booking made on
# NA 315 (flight 3) for Ethan (traveler 3) in 9F of that flight (seat 13, not seat 11 of NA 311)
b_added, b_removed, b_changed = diff("bookings")
if b_removed or set(b_changed) != {3} or len(b_added) != 1:
    return False
before, after = b_changed[3]
if after["status"] != "cancelled" or not only_changed(before, after, {"status"}):
    return False
bk = b_added[0]
if bk["user_id"] != 1 or bk["flight_id"] != 3 or bk["status"] != "confirmed":
    return False
p_added, p_removed, p_changed = diff("booking_passengers")
if p_removed or p_changed or len(p_added) != 1:
    return False
bp = p_added[0]
if bp["booking_id"] != bk["id"] or bp["traveler_id"] != 3 or bp["seat_id"] != 13:
    return False
return unchanged("users", "travelers", "flights", "seats", "loyalty_accounts", "hotel_reservations")
''')

V_DUPLICATE_HOTEL = _verifier(r'''
# the Canal House stay was entered twice: the newer one (3) goes, the original (2) stays confirmed
added, removed, changed = diff("hotel_reservations")
if added:
    return False
removed_ids = {r["id"] for r in removed}
if removed_ids - {3} or set(changed) - {3}:
    return False
if 3 in changed:
    before, after = changed[3]
    if after["status"] != "cancelled" or not only_changed(before, after, {"status"}):
        return False
elif 3 not in removed_ids:
    return False
final = table(final_db_path, "hotel_reservations")
if final.get(2, {}).get("status") != "confirmed":
    return False
return unchanged("users", "travelers", "flights", "seats", "loyalty_accounts", "bookings",
                 "booking_passengers")
''')


def _call(tool: str, **arguments) -> dict:
    return {"tool": tool, "arguments": arguments}


TASKS = [
    {
        "task": "Which seat is Maya Chen assigned on my flight booking with confirmation code 'QX7K2P'?",
        "task_type": "info_seeking",
        "repair": False,
        "verifier": V_MAYA_SEAT,
        "solution": {
            "calls": [_call("list_bookings", confirmation_code="QX7K2P")],
            "final_answer": "Maya Chen is in seat 14B on booking QX7K2P (flight AB 77, LHR to JFK).",
        },
        "wrong": {
            "calls": [_call("list_bookings", confirmation_code="QX7K2P")],
            "final_answer": "Maya Chen has seat 14A.",
        },
    },
    {
        "task": "Which of my loyalty programs currently has the highest points balance, and how many points does it hold?",
        "task_type": "info_seeking",
        "repair": False,
        "verifier": V_TOP_LOYALTY,
        "solution": {
            "calls": [_call("list_loyalty_accounts")],
            "final_answer": "Your Stayway Rewards hotel program has the most points: 73,200.",
        },
        "wrong": {
            "calls": [_call("list_loyalty_accounts", program_type="airline")],
            "final_answer": "Atlantic Blue Voyager has the highest balance with 61,450 points.",
        },
    },
    {
        "task": "How many economy window seats are still available on flight NA 208 from Oslo (OSL) to Copenhagen (CPH)?",
        "task_type": "info_seeking",
        "repair": False,
        "verifier": V_FREE_WINDOWS,
        "solution": {
            "calls": [
                _call("search_flights", origin="OSL", destination="CPH"),
                _call("get_flight_seats", flight_id=1, cabin="economy", available_only=True),
            ],
            "final_answer": "2 economy window seats are still free on NA 208: 12A and 18F.",
        },
        "wrong": {
            "calls": [
                _call("search_flights", flight_number="NA 208"),
                _call("get_flight_seats", flight_id=1, cabin="economy", available_only=True),
            ],
            "final_answer": "There are 6 economy seats available.",
        },
    },
    {
        "task": "Create a new booking for Maya Chen on flight NA 208 from Oslo (OSL) to Copenhagen (CPH) with seat 12A.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": V_BOOK_MAYA,
        "solution": {
            "calls": [
                _call("list_travelers", name="Maya"),
                _call("search_flights", flight_number="NA 208"),
                _call("get_flight_seats", flight_id=1, available_only=True),
                _call("create_booking", flight_id=1, traveler_id=2, seat_number="12A"),
            ],
            "final_answer": "Maya Chen is booked on NA 208 (OSL to CPH) in seat 12A.",
        },
        "wrong": {
            "calls": [
                _call("list_bookings", status="confirmed"),
                _call("add_passenger_to_booking", booking_id=4, traveler_id=2, seat_number="12A"),
            ],
            "final_answer": "Added Maya to your NA 208 booking in seat 12A.",
        },
    },
    {
        "task": "Save my colleague Jonas Berg (born 1988-04-17, passport P7733190) as a traveler and add him to my booking 'LM4R9T' in seat 22D.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": V_ADD_JONAS,
        "solution": {
            "calls": [
                _call("create_traveler", first_name="Jonas", last_name="Berg", date_of_birth="1988-04-17",
                      passport_number="P7733190"),
                _call("list_bookings", confirmation_code="LM4R9T"),
                _call("get_flight_seats", flight_id=5),
                _call("add_passenger_to_booking", booking_id=2, traveler_id=5, seat_number="22D"),
            ],
            "final_answer": "Jonas Berg is saved and added to booking LM4R9T in seat 22D.",
        },
        "wrong": {
            "calls": [
                _call("create_traveler", first_name="Jonas", last_name="Berg", date_of_birth="1988-04-17",
                      passport_number="P7733190"),
                _call("search_flights", flight_number="AB 78"),
                _call("create_booking", flight_id=5, traveler_id=5, seat_number="22D"),
            ],
            "final_answer": "Booked Jonas on AB 78 in seat 22D.",
        },
    },
    {
        "task": "On my booking 'QX7K2P', move Ethan Chen to seat 14C so he sits next to Maya.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": V_MOVE_ETHAN,
        "solution": {
            "calls": [
                _call("list_bookings", confirmation_code="QX7K2P"),
                _call("get_flight_seats", flight_id=4, available_only=True),
                _call("assign_seat", booking_id=1, traveler_id=3, seat_number="14C"),
            ],
            "final_answer": "Ethan Chen now sits in 14C next to Maya (14B) on QX7K2P.",
        },
        "wrong": {
            "calls": [
                _call("list_bookings", confirmation_code="QX7K2P"),
                _call("assign_seat", booking_id=1, traveler_id=3, seat_number="14D"),
            ],
            "final_answer": "Ethan moved to row 14.",
        },
    },
    {
        "task": "Extend my 'Alpine Lodge' reservation in Zermatt from 4 to 5 nights and raise the number of guests to 4.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": V_EXTEND_ALPINE,
        "solution": {
            "calls": [
                _call("list_hotel_reservations", city="Zermatt"),
                _call("update_hotel_reservation", reservation_id=4, nights=5, guests=4),
            ],
            "final_answer": "The Alpine Lodge stay in Zermatt is now 5 nights for 4 guests.",
        },
        "wrong": {
            "calls": [
                _call("list_hotel_reservations", hotel_name="Alpine"),
                _call("create_hotel_reservation", hotel_name="Alpine Lodge", city="Zermatt", check_in_date="2027-02-10",
                      nights=5, room_type="suite", guests=4, nightly_rate=310.0),
            ],
            "final_answer": "Booked Alpine Lodge for 5 nights and 4 guests.",
        },
    },
    {
        "task": "Credit my 'Atlantic Blue Voyager' loyalty account to both of my confirmed Atlantic Blue flight bookings.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": V_CREDIT_MILES,
        "solution": {
            "calls": [
                _call("list_loyalty_accounts", program_type="airline"),
                _call("list_bookings", status="confirmed"),
                _call("update_booking_loyalty", booking_id=1, loyalty_account_id=2),
                _call("update_booking_loyalty", booking_id=2, loyalty_account_id=2),
            ],
            "final_answer": "Atlantic Blue Voyager (ABV-330918) is now credited on QX7K2P and LM4R9T.",
        },
        "wrong": {
            "calls": [
                _call("list_bookings", confirmation_code="LM4R9T"),
                _call("update_booking_loyalty", booking_id=2, loyalty_account_id=2),
            ],
            "final_answer": "Added your Atlantic Blue number to the booking.",
        },
    },
    {
        "task": "My booking 'ZP3W8N' for Ethan Chen on flight NA 311 from Copenhagen (CPH) to London (LHR) was made for the wrong day; cancel it and book Ethan on the next day's NA 315 on the same route in seat 9F instead.",
        "task_type": "state_mutating",
        "repair": True,
        "verifier": V_REBOOK_ETHAN,
        "solution": {
            "calls": [
                _call("list_bookings", confirmation_code="ZP3W8N"),
                _call("search_flights", origin="CPH", destination="LHR"),
                _call("get_flight_seats", flight_id=3, available_only=True),
                _call("cancel_booking", booking_id=3),
                _call("create_booking", flight_id=3, traveler_id=3, seat_number="9F"),
            ],
            "final_answer": "Cancelled ZP3W8N on NA 311 and booked Ethan Chen on NA 315 (CPH to LHR) in seat 9F.",
        },
        "wrong": {
            "calls": [
                _call("search_flights", origin="CPH", destination="LHR"),
                _call("create_booking", flight_id=3, traveler_id=3, seat_number="9F"),
            ],
            "final_answer": "Ethan is now booked on NA 315 in 9F.",
        },
    },
    {
        "task": "I accidentally reserved the 'Canal House Hotel' in Amsterdam twice for the same stay; cancel the duplicate that was made most recently and keep my original reservation.",
        "task_type": "state_mutating",
        "repair": True,
        "verifier": V_DUPLICATE_HOTEL,
        "solution": {
            "calls": [
                _call("list_hotel_reservations", city="Amsterdam"),
                _call("cancel_hotel_reservation", reservation_id=3),
            ],
            "final_answer": "Cancelled the newer duplicate (CH-55187); your original Canal House reservation CH-55102 stays confirmed.",
        },
        "wrong": {
            "calls": [
                _call("list_hotel_reservations", city="Amsterdam"),
                _call("cancel_hotel_reservation", reservation_id=2),
            ],
            "final_answer": "Cancelled the duplicate Canal House reservation.",
        },
    },
]

PROBES = [
    _call("update_traveler", traveler_id=1, passport_number="P4410999"),
    _call("update_traveler", traveler_id=4, passport_number="X0000000"),
    _call("create_booking", flight_id=7, traveler_id=1),
    _call("create_booking", flight_id=1, traveler_id=1, seat_number="14A"),
    _call("update_booking_loyalty", booking_id=2, loyalty_account_id=1),
    _call("assign_seat", booking_id=1, traveler_id=3, seat_number="99Z"),
    _call("add_passenger_to_booking", booking_id=1, traveler_id=2),
    _call("search_flights", airline="Nordic", include_cancelled=True),
    _call("list_travelers"),
    _call("list_hotel_reservations", status="cancelled"),
    _call("cancel_hotel_reservation", reservation_id=5),
    _call("update_hotel_reservation", reservation_id=5, nights=2),
    _call("cancel_booking", booking_id=5),
    _call("create_traveler", first_name="Maya", last_name="Chen", date_of_birth="2012-06-30"),
]

# ---------------------------------------------------------------------------
# task families (awm.scenarios.families): parameterised tasks, one instance per slot row.
# New bookings get random confirmation codes: no check below looks at one.
# ---------------------------------------------------------------------------

# The hand-written tasks' helpers plus money comparisons and answer_text() (the final answer lower-cased).
_family_verifier = partial(verifier, prelude(
    '''tables = ["users", "travelers", "flights", "seats", "loyalty_accounts", "bookings",
          "booking_passengers", "hotel_reservations"]''',
    TABLE_BY_ID, DIFF_ROWS, UNCHANGED_BY_DIFF, NUMBERS, ONLY_CHANGED, SAME_MONEY, MENTIONS_AMOUNT, ANSWER_TEXT))

# `held`: the seats a confirmed booking holds; `free`: each flight's free economy seats numbered k = 1..n
# (highest id first), so that the passengers of one booking are spread over different free seats.
_FREE_SEATS_CTE = (
    "WITH held AS (SELECT bp.seat_id FROM booking_passengers bp JOIN bookings b ON b.id = bp.booking_id "
    "WHERE b.status = 'confirmed' AND bp.seat_id IS NOT NULL), "
    "free AS (SELECT s.id, s.flight_id, s.seat_number, s.extra_fee, "
    "ROW_NUMBER() OVER (PARTITION BY s.flight_id ORDER BY s.id DESC) AS k, "
    "COUNT(*) OVER (PARTITION BY s.flight_id) AS n "
    "FROM seats s WHERE s.cabin = 'economy' AND s.id NOT IN (SELECT seat_id FROM held)) "
)

FAMILIES = [
    {
        "family": "flight_base_fare",
        "task_type": "info_seeking",
        "slots": "SELECT flight_number, origin, destination, status, base_fare, printf('%.2f', base_fare) AS fare_text "
                 "FROM flights ORDER BY id",
        "task": "What is the base fare per passenger on flight {flight_number} from {origin} to {destination}?",
        "verifier": _family_verifier,
        "check": 'return unchanged(*tables) and mentions_amount(answer_text(), P["base_fare"])',
        "solution": {"calls": [{"tool": "search_flights", "arguments": {"flight_number": "{flight_number}",
                                                                       "include_cancelled": True}}],
                     "final_answer": "The base fare on {flight_number} ({origin} to {destination}, {status}) is "
                                     "${fare_text} per passenger."},
    },
    {
        "family": "seat_ticket_price",
        "task_type": "info_seeking",
        # free seats that carry a fee, on the flights that can still be booked
        "slots": _FREE_SEATS_CTE + "SELECT s.seat_number AS seat, f.id AS flight_id, f.flight_number, "
                 "ROUND(f.base_fare + s.extra_fee, 2) AS price, printf('%.2f', f.base_fare + s.extra_fee) AS price_text, "
                 "printf('%.2f', f.base_fare) AS fare_text, printf('%.2f', s.extra_fee) AS fee_text "
                 "FROM seats s JOIN flights f ON f.id = s.flight_id WHERE f.status <> 'cancelled' "
                 "AND s.extra_fee > 0 AND s.id NOT IN (SELECT seat_id FROM held) ORDER BY s.id",
        "limit": 12,
        "task": "What would one ticket on flight {flight_number} in seat {seat} cost in total, base fare plus the "
                "seat selection fee?",
        "verifier": _family_verifier,
        "check": 'return unchanged(*tables) and mentions_amount(answer_text(), P["price"])',
        "solution": {"calls": [{"tool": "search_flights", "arguments": {"flight_number": "{flight_number}"}},
                               {"tool": "get_flight_seats", "arguments": {"flight_id": "{flight_id}"}}],
                     "final_answer": "A ticket on {flight_number} in seat {seat} costs ${price_text} in total "
                                     "(fare ${fare_text} plus seat fee ${fee_text})."},
    },
    {
        "family": "passenger_seat",
        "task_type": "info_seeking",
        "slots": "SELECT b.confirmation_code AS code, t.first_name || ' ' || t.last_name AS traveler, "
                 "s.seat_number AS seat FROM booking_passengers bp JOIN bookings b ON b.id = bp.booking_id "
                 "JOIN travelers t ON t.id = bp.traveler_id JOIN seats s ON s.id = bp.seat_id "
                 "WHERE b.user_id = 1 AND b.status = 'confirmed' ORDER BY bp.id",
        "task": "What seat number does {traveler} have on my booking '{code}'?",
        "verifier": _family_verifier,
        "check": '''
seat = P["seat"].lower()
if not re.search(r"\\b" + re.escape(seat[:-1]) + r"\\s*" + re.escape(seat[-1]) + r"\\b", answer_text()):
    return False
return unchanged(*tables)
''',
        "solution": {"calls": [{"tool": "list_bookings", "arguments": {"confirmation_code": "{code}"}}],
                     "final_answer": "{traveler} is in seat {seat} on booking {code}."},
    },
    {
        "family": "booking_total_price",
        "task_type": "info_seeking",
        "slots": "SELECT confirmation_code AS code, status, total_price, printf('%.2f', total_price) AS total_text "
                 "FROM bookings WHERE user_id = 1 ORDER BY id",
        "task": "What is the total price recorded on my booking '{code}'?",
        "verifier": _family_verifier,
        "check": 'return unchanged(*tables) and mentions_amount(answer_text(), P["total_price"])',
        "solution": {"calls": [{"tool": "list_bookings", "arguments": {"confirmation_code": "{code}"}}],
                     "final_answer": "Booking {code} ({status}) has a total price of ${total_text}."},
    },
    {
        "family": "book_flight_seat",
        "task_type": "state_mutating",
        # free seats on bookable flights, each paired with one of the user's travelers (a diagonal walk)
        # who is not already booked on that flight
        "slots": _FREE_SEATS_CTE + "SELECT f.id AS flight_id, f.flight_number, f.origin, f.destination, "
                 "s.seat_number AS seat, s.id AS seat_id, t.id AS traveler_id, "
                 "t.first_name || ' ' || t.last_name AS traveler, ROUND(f.base_fare + s.extra_fee, 2) AS price "
                 "FROM seats s JOIN flights f ON f.id = s.flight_id "
                 "JOIN travelers t ON t.user_id = 1 AND t.id = 1 + (s.id + s.flight_id) % 3 "
                 "WHERE f.status <> 'cancelled' AND s.id NOT IN (SELECT seat_id FROM held) "
                 "AND NOT EXISTS (SELECT 1 FROM booking_passengers bp JOIN bookings b ON b.id = bp.booking_id "
                 "WHERE b.status = 'confirmed' AND b.flight_id = f.id AND bp.traveler_id = t.id) ORDER BY s.id",
        "task": "Please book {traveler} onto flight {flight_number} from {origin} to {destination}, in seat {seat}.",
        "verifier": _family_verifier,
        "check": '''
b_added, b_removed, b_changed = diff("bookings")
if b_removed or b_changed or len(b_added) != 1:
    return False
bk = b_added[0]
if (bk["user_id"] != 1 or bk["flight_id"] != P["flight_id"] or bk["status"] != "confirmed"
        or not same_money(bk["total_price"], P["price"])):
    return False
p_added, p_removed, p_changed = diff("booking_passengers")
if p_removed or p_changed or len(p_added) != 1:
    return False
bp = p_added[0]
if bp["booking_id"] != bk["id"] or bp["traveler_id"] != P["traveler_id"] or bp["seat_id"] != P["seat_id"]:
    return False
return unchanged("users", "travelers", "flights", "seats", "loyalty_accounts", "hotel_reservations")
''',
        "solution": {"calls": [{"tool": "list_travelers", "arguments": {"name": "{traveler}"}},
                               {"tool": "search_flights", "arguments": {"flight_number": "{flight_number}"}},
                               {"tool": "get_flight_seats", "arguments": {"flight_id": "{flight_id}",
                                                                         "available_only": True}},
                               {"tool": "create_booking", "arguments": {"flight_id": "{flight_id}",
                                                                       "traveler_id": "{traveler_id}",
                                                                       "seat_number": "{seat}"}}],
                     "final_answer": "{traveler} is booked on {flight_number} ({origin} to {destination}) in seat "
                                     "{seat}."},
    },
    {
        "family": "change_passenger_seat",
        "task_type": "state_mutating",
        # each passenger of the user's confirmed bookings, moved to a free economy seat of the same flight
        "slots": _FREE_SEATS_CTE + ", pax AS (SELECT bp.id AS bp_id, b.id AS booking_id, b.confirmation_code AS code, "
                 "b.flight_id, b.total_price, bp.traveler_id, bp.seat_id AS old_seat_id, "
                 "ROW_NUMBER() OVER (PARTITION BY b.id ORDER BY bp.id) AS k FROM booking_passengers bp "
                 "JOIN bookings b ON b.id = bp.booking_id WHERE b.user_id = 1 AND b.status = 'confirmed') "
                 "SELECT p.bp_id, p.booking_id, p.code, p.traveler_id, t.first_name || ' ' || t.last_name AS traveler, "
                 "fr.id AS seat_id, fr.seat_number AS seat, "
                 "ROUND(p.total_price - old.extra_fee + fr.extra_fee, 2) AS new_total FROM pax p "
                 "JOIN travelers t ON t.id = p.traveler_id JOIN seats old ON old.id = p.old_seat_id "
                 "JOIN free fr ON fr.flight_id = p.flight_id AND fr.k = (p.k - 1) % fr.n + 1 ORDER BY p.bp_id",
        "task": "On my booking '{code}', please move {traveler} to seat {seat}.",
        "verifier": _family_verifier,
        "check": '''
p_added, p_removed, p_changed = diff("booking_passengers")
if p_added or p_removed or set(p_changed) != {P["bp_id"]}:
    return False
before, after = p_changed[P["bp_id"]]
if after["seat_id"] != P["seat_id"] or not only_changed(before, after, {"seat_id"}):
    return False
b_added, b_removed, b_changed = diff("bookings")
if b_added or b_removed or set(b_changed) - {P["booking_id"]}:
    return False
for b_before, b_after in b_changed.values():
    if not only_changed(b_before, b_after, {"total_price"}):
        return False
final = table(final_db_path, "bookings")
if not same_money(final[P["booking_id"]]["total_price"], P["new_total"]):
    return False
return unchanged("users", "travelers", "flights", "seats", "loyalty_accounts", "hotel_reservations")
''',
        "solution": {"calls": [{"tool": "list_bookings", "arguments": {"confirmation_code": "{code}"}},
                               {"tool": "assign_seat", "arguments": {"booking_id": "{booking_id}",
                                                                    "traveler_id": "{traveler_id}",
                                                                    "seat_number": "{seat}"}}],
                     "final_answer": "{traveler} now sits in seat {seat} on booking {code}."},
    },
    {
        "family": "add_passenger_to_booking",
        "task_type": "state_mutating",
        # each saved traveler not yet on one of the user's confirmed bookings, with a free economy seat there
        "slots": _FREE_SEATS_CTE + ", cand AS (SELECT b.id AS booking_id, b.confirmation_code AS code, b.flight_id, "
                 "b.total_price, t.id AS traveler_id, t.first_name || ' ' || t.last_name AS traveler, "
                 "ROW_NUMBER() OVER (PARTITION BY b.id ORDER BY t.id) AS k FROM bookings b "
                 "JOIN travelers t ON t.user_id = b.user_id WHERE b.user_id = 1 AND b.status = 'confirmed' "
                 "AND NOT EXISTS (SELECT 1 FROM booking_passengers bp WHERE bp.booking_id = b.id "
                 "AND bp.traveler_id = t.id)) "
                 "SELECT c.booking_id, c.code, c.flight_id, f.flight_number, c.traveler_id, c.traveler, fr.id AS seat_id, "
                 "fr.seat_number AS seat, ROUND(c.total_price + f.base_fare + fr.extra_fee, 2) AS new_total "
                 "FROM cand c JOIN flights f ON f.id = c.flight_id "
                 "JOIN free fr ON fr.flight_id = c.flight_id AND fr.k = (c.k - 1) % fr.n + 1 "
                 "ORDER BY c.booking_id, c.traveler_id",
        "task": "Add {traveler} to my booking '{code}' on flight {flight_number} with seat {seat}.",
        "verifier": _family_verifier,
        "check": '''
p_added, p_removed, p_changed = diff("booking_passengers")
if p_removed or p_changed or len(p_added) != 1:
    return False
bp = p_added[0]
if bp["booking_id"] != P["booking_id"] or bp["traveler_id"] != P["traveler_id"] or bp["seat_id"] != P["seat_id"]:
    return False
b_added, b_removed, b_changed = diff("bookings")
if b_added or b_removed or set(b_changed) != {P["booking_id"]}:
    return False
before, after = b_changed[P["booking_id"]]
if not same_money(after["total_price"], P["new_total"]) or not only_changed(before, after, {"total_price"}):
    return False
return unchanged("users", "travelers", "flights", "seats", "loyalty_accounts", "hotel_reservations")
''',
        "solution": {"calls": [{"tool": "list_travelers", "arguments": {"name": "{traveler}"}},
                               {"tool": "list_bookings", "arguments": {"confirmation_code": "{code}"}},
                               {"tool": "get_flight_seats", "arguments": {"flight_id": "{flight_id}",
                                                                         "available_only": True}},
                               {"tool": "add_passenger_to_booking", "arguments": {"booking_id": "{booking_id}",
                                                                                 "traveler_id": "{traveler_id}",
                                                                                 "seat_number": "{seat}"}}],
                     "final_answer": "{traveler} is now on booking {code} ({flight_number}) in seat {seat}."},
    },
]
