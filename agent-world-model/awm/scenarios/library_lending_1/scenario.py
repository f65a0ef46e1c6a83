"""library_lending_1: a public library's member portal (catalogue, loans, holds, fines)."""

from functools import partial

from awm.scenarios.verifier_kit import ID_DIFF_PRELUDE, verifier

NAME = "library_lending_1"

DESCRIPTION = (
    "Riverton Public Library is a municipal library system with four branches (Central Library, Riverside "
    "Branch, Eastside Branch and Northgate Branch) that share one catalogue. Members use the online portal to "
    "search the catalogue by title, author or genre and see, for every book, each physical copy with its "
    "barcode, shelf location, owning branch and current status (available, on loan, on the hold shelf, in "
    "repair or lost). A logged-in member can check out a specific available copy for a 21-day loan, see "
    "their current and past loans ordered by due date, renew an active loan up to twice (unless another "
    "member is waiting for the book), and return a copy at any branch; a returned copy is re-shelved at the "
    "branch where it was dropped off. When no copy is free, members place holds that join a first-come, "
    "first-served queue per book and choose the branch where they want to pick the book up; a waiting hold "
    "can be moved to another pickup branch or annotated without losing its place in the queue, or it can be "
    "cancelled. The portal also shows the member's fines, such as overdue charges and damage fees, which "
    "can be unpaid, paid or waived, and lets the member pay an unpaid fine in full by card, cash or account "
    "credit. Members can view their account (home branch, loan limit, number of active loans and the total "
    "of unpaid fines) and update their contact email or home branch. The environment models the everyday "
    "self-service workflows of a library patron: finding which branch has a copy on the shelf, borrowing "
    "and returning, managing reservations and settling charges."
)

TABLES = [
    {
        "name": "branches",
        "ddl": (
            "CREATE TABLE branches (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    name TEXT NOT NULL UNIQUE,\n"
            "    address TEXT NOT NULL,\n"
            "    phone TEXT,\n"
            "    opening_hours TEXT,\n"
            "    created_at DATETIME DEFAULT CURRENT_TIMESTAMP\n"
            ");"
        ),
        "indexes": ["CREATE INDEX idx_branches_name ON branches(name);"],
    },
    {
        "name": "members",
        "ddl": (
            "CREATE TABLE members (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    full_name TEXT NOT NULL,\n"
            "    email TEXT NOT NULL UNIQUE,\n"
            "    card_number TEXT NOT NULL UNIQUE,\n"
            "    home_branch_id INTEGER NOT NULL,\n"
            "    status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'suspended', 'expired')),\n"
            "    max_loans INTEGER NOT NULL DEFAULT 5 CHECK (max_loans > 0),\n"
            "    created_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    FOREIGN KEY (home_branch_id) REFERENCES branches(id)\n"
            ");"
        ),
        "indexes": ["CREATE INDEX idx_members_home_branch_id ON members(home_branch_id);"],
    },
    {
        "name": "books",
        "ddl": (
            "CREATE TABLE books (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    title TEXT NOT NULL,\n"
            "    author TEXT NOT NULL,\n"
            "    isbn TEXT UNIQUE,\n"
            "    genre TEXT,\n"
            "    publication_year INTEGER CHECK (publication_year > 0),\n"
            "    created_at DATETIME DEFAULT CURRENT_TIMESTAMP\n"
            ");"
        ),
        "indexes": [
            "CREATE INDEX idx_books_title ON books(title);",
            "CREATE INDEX idx_books_author ON books(author);",
        ],
    },
    {
        "name": "copies",
        "ddl": (
            "CREATE TABLE copies (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    book_id INTEGER NOT NULL,\n"
            "    branch_id INTEGER NOT NULL,\n"
            "    barcode TEXT NOT NULL UNIQUE,\n"
            "    status TEXT NOT NULL DEFAULT 'available'\n"
            "        CHECK (status IN ('available', 'on_loan', 'on_hold_shelf', 'in_repair', 'lost')),\n"
            "    shelf_location TEXT,\n"
            "    acquired_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    FOREIGN KEY (book_id) REFERENCES books(id) ON DELETE CASCADE,\n"
            "    FOREIGN KEY (branch_id) REFERENCES branches(id)\n"
            ");"
        ),
        "indexes": [
            "CREATE INDEX idx_copies_book_id ON copies(book_id);",
            "CREATE INDEX idx_copies_branch_status ON copies(branch_id, status);",
        ],
    },
    {
        "name": "loans",
        "ddl": (
            "CREATE TABLE loans (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    copy_id INTEGER NOT NULL,\n"
            "    member_id INTEGER NOT NULL,\n"
            "    checked_out_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,\n"
            "    due_at DATETIME NOT NULL,\n"
            "    returned_at DATETIME,\n"
            "    return_branch_id INTEGER,\n"
            "    renewals INTEGER NOT NULL DEFAULT 0 CHECK (renewals >= 0 AND renewals <= 2),\n"
            "    status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'returned', 'lost')),\n"
            "    FOREIGN KEY (copy_id) REFERENCES copies(id),\n"
            "    FOREIGN KEY (member_id) REFERENCES members(id),\n"
            "    FOREIGN KEY (return_branch_id) REFERENCES branches(id)\n"
            ");"
        ),
        "indexes": [
            "CREATE INDEX idx_loans_member_status ON loans(member_id, status);",
            "CREATE INDEX idx_loans_copy_id ON loans(copy_id);",
        ],
    },
    {
        "name": "holds",
        "ddl": (
            "CREATE TABLE holds (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    book_id INTEGER NOT NULL,\n"
            "    member_id INTEGER NOT NULL,\n"
            "    pickup_branch_id INTEGER NOT NULL,\n"
            "    status TEXT NOT NULL DEFAULT 'waiting'\n"
            "        CHECK (status IN ('waiting', 'ready', 'fulfilled', 'cancelled')),\n"
            "    placed_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,\n"
            "    expires_at DATETIME,\n"
            "    notes TEXT,\n"
            "    FOREIGN KEY (book_id) REFERENCES books(id) ON DELETE CASCADE,\n"
            "    FOREIGN KEY (member_id) REFERENCES members(id),\n"
            "    FOREIGN KEY (pickup_branch_id) REFERENCES branches(id)\n"
            ");"
        ),
        "indexes": [
            "CREATE INDEX idx_holds_book_status ON holds(book_id, status, placed_at);",
            "CREATE INDEX idx_holds_member_id ON holds(member_id);",
        ],
    },
    {
        "name": "fines",
        "ddl": (
            "CREATE TABLE fines (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    member_id INTEGER NOT NULL,\n"
            "    loan_id INTEGER,\n"
            "    amount REAL NOT NULL CHECK (amount >= 0),\n"
            "    reason TEXT NOT NULL,\n"
            "    status TEXT NOT NULL DEFAULT 'unpaid' CHECK (status IN ('unpaid', 'paid', 'waived')),\n"
            "    issued_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    paid_at DATETIME,\n"
            "    payment_method TEXT CHECK (payment_method IS NULL OR payment_method IN ('card', 'cash', "
            "'account_credit')),\n"
            "    FOREIGN KEY (member_id) REFERENCES members(id),\n"
            "    FOREIGN KEY (loan_id) REFERENCES loans(id)\n"
            ");"
        ),
        "indexes": ["CREATE INDEX idx_fines_member_status ON fines(member_id, status);"],
    },
]

SAMPLE = [
    {
        "table_name": "branches",
        "reasoning": "Four branches so that tasks can name a pickup or drop-off branch different from the "
        "member's home branch (Central Library).",
        "insert_statements": [
            "INSERT INTO branches (id, name, address, phone, opening_hours, created_at) VALUES (1, 'Central Library', '200 Civic Plaza', '555-0101', 'Mon-Sat 09:00-20:00, Sun 12:00-17:00', datetime('now', '-3650 days'));",
            "INSERT INTO branches (id, name, address, phone, opening_hours, created_at) VALUES (2, 'Riverside Branch', '18 Quay Road', '555-0102', 'Mon-Sat 10:00-18:00', datetime('now', '-2900 days'));",
            "INSERT INTO branches (id, name, address, phone, opening_hours, created_at) VALUES (3, 'Eastside Branch', '731 Orchard Avenue', '555-0103', 'Tue-Sat 10:00-18:00', datetime('now', '-2100 days'));",
            "INSERT INTO branches (id, name, address, phone, opening_hours, created_at) VALUES (4, 'Northgate Branch', '5 Northgate Mall, Unit 12', '555-0104', 'Mon-Fri 11:00-19:00', datetime('now', '-900 days'));",
        ],
    },
    {
        "table_name": "members",
        "reasoning": "Member 1 (Jordan Reyes) is the logged-in user with a six-loan limit; the other members own "
        "loans and holds that compete for the same books.",
        "insert_statements": [
            "INSERT INTO members (id, full_name, email, card_number, home_branch_id, status, max_loans, created_at) VALUES (1, 'Jordan Reyes', 'jordan.reyes@example.com', 'LC-100001', 1, 'active', 6, datetime('now', '-1200 days'));",
            "INSERT INTO members (id, full_name, email, card_number, home_branch_id, status, max_loans, created_at) VALUES (2, 'Priya Nair', 'priya.nair@example.com', 'LC-100002', 2, 'active', 5, datetime('now', '-800 days'));",
            "INSERT INTO members (id, full_name, email, card_number, home_branch_id, status, max_loans, created_at) VALUES (3, 'Marcus Webb', 'marcus.webb@example.com', 'LC-100003', 3, 'active', 5, datetime('now', '-640 days'));",
            "INSERT INTO members (id, full_name, email, card_number, home_branch_id, status, max_loans, created_at) VALUES (4, 'Elena Sokolova', 'elena.sokolova@example.com', 'LC-100004', 1, 'active', 5, datetime('now', '-300 days'));",
            "INSERT INTO members (id, full_name, email, card_number, home_branch_id, status, max_loans, created_at) VALUES (5, 'Tom Okafor', 'tom.okafor@example.com', 'LC-100005', 4, 'suspended', 5, datetime('now', '-150 days'));",
        ],
    },
    {
        "table_name": "books",
        "reasoning": "Ten titles covering every task: books with free copies at some branches only, books with "
        "no free copy (holds), and titles the member has on loan or returned late.",
        "insert_statements": [
            "INSERT INTO books (id, title, author, isbn, genre, publication_year, created_at) VALUES (1, 'Project Hail Mary', 'Andy Weir', '9780593135204', 'Science Fiction', 2021, datetime('now', '-1000 days'));",
            "INSERT INTO books (id, title, author, isbn, genre, publication_year, created_at) VALUES (2, 'Piranesi', 'Susanna Clarke', '9781635575637', 'Fantasy', 2020, datetime('now', '-1100 days'));",
            "INSERT INTO books (id, title, author, isbn, genre, publication_year, created_at) VALUES (3, 'The Overstory', 'Richard Powers', '9780393635522', 'Literary Fiction', 2018, datetime('now', '-1500 days'));",
            "INSERT INTO books (id, title, author, isbn, genre, publication_year, created_at) VALUES (4, 'Klara and the Sun', 'Kazuo Ishiguro', '9780593318171', 'Science Fiction', 2021, datetime('now', '-950 days'));",
            "INSERT INTO books (id, title, author, isbn, genre, publication_year, created_at) VALUES (5, 'Dune', 'Frank Herbert', '9780441172719', 'Science Fiction', 1965, datetime('now', '-3000 days'));",
            "INSERT INTO books (id, title, author, isbn, genre, publication_year, created_at) VALUES (6, 'Circe', 'Madeline Miller', '9780316556347', 'Fantasy', 2018, datetime('now', '-1400 days'));",
            "INSERT INTO books (id, title, author, isbn, genre, publication_year, created_at) VALUES (7, 'Educated', 'Tara Westover', '9780399590504', 'Memoir', 2018, datetime('now', '-1450 days'));",
            "INSERT INTO books (id, title, author, isbn, genre, publication_year, created_at) VALUES (8, 'The Left Hand of Darkness', 'Ursula K. Le Guin', '9780441478125', 'Science Fiction', 1969, datetime('now', '-3200 days'));",
            "INSERT INTO books (id, title, author, isbn, genre, publication_year, created_at) VALUES (9, 'Braiding Sweetgrass', 'Robin Wall Kimmerer', '9781571313560', 'Nature', 2013, datetime('now', '-1700 days'));",
            "INSERT INTO books (id, title, author, isbn, genre, publication_year, created_at) VALUES (10, 'The Midnight Library', 'Matt Haig', '9780525559474', 'Literary Fiction', 2020, datetime('now', '-1050 days'));",
        ],
    },
    {
        "table_name": "copies",
        "reasoning": "Copy statuses agree with the active loans below. 'Project Hail Mary' has a free copy at "
        "Central and at Riverside; 'The Left Hand of Darkness' has two free copies at Riverside and one each at "
        "Central and Eastside; every copy of 'Klara and the Sun' and 'Dune' is out.",
        "insert_statements": [
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (1, 1, 1, 'LIB-000101', 'available', 'SF WEI', datetime('now', '-1000 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (2, 1, 1, 'LIB-000102', 'on_loan', 'SF WEI', datetime('now', '-1000 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (3, 1, 2, 'LIB-000103', 'available', 'SF WEI', datetime('now', '-990 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (4, 2, 1, 'LIB-000201', 'on_loan', 'FAN CLA', datetime('now', '-1100 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (5, 2, 3, 'LIB-000202', 'available', 'FAN CLA', datetime('now', '-1080 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (6, 3, 1, 'LIB-000301', 'on_loan', 'FIC POW', datetime('now', '-1500 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (7, 4, 1, 'LIB-000401', 'on_loan', 'SF ISH', datetime('now', '-950 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (8, 4, 3, 'LIB-000402', 'on_loan', 'SF ISH', datetime('now', '-940 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (9, 5, 2, 'LIB-000501', 'on_loan', 'SF HER', datetime('now', '-3000 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (10, 5, 1, 'LIB-000502', 'on_loan', 'SF HER', datetime('now', '-2500 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (11, 6, 1, 'LIB-000601', 'available', 'FAN MIL', datetime('now', '-1400 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (12, 7, 1, 'LIB-000701', 'on_loan', 'BIO WES', datetime('now', '-1450 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (13, 7, 1, 'LIB-000702', 'on_loan', 'BIO WES', datetime('now', '-1440 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (14, 8, 2, 'LIB-000801', 'available', 'SF LEG', datetime('now', '-3200 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (15, 8, 2, 'LIB-000802', 'available', 'SF LEG', datetime('now', '-2000 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (16, 8, 2, 'LIB-000803', 'on_loan', 'SF LEG', datetime('now', '-1800 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (17, 8, 1, 'LIB-000804', 'available', 'SF LEG', datetime('now', '-1200 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (18, 8, 3, 'LIB-000805', 'available', 'SF LEG', datetime('now', '-700 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (19, 9, 4, 'LIB-000901', 'available', 'NAT KIM', datetime('now', '-1700 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (20, 10, 1, 'LIB-001001', 'on_loan', 'FIC HAI', datetime('now', '-1050 days'));",
            "INSERT INTO copies (id, book_id, branch_id, barcode, status, shelf_location, acquired_at) VALUES (21, 10, 2, 'LIB-001002', 'in_repair', 'FIC HAI', datetime('now', '-1000 days'));",
        ],
    },
    {
        "table_name": "loans",
        "reasoning": "Member 1 has five active loans (Piranesi, The Overstory, two copies of Educated of which the "
        "second was checked out two hours ago by mistake, and The Midnight Library, due soonest) plus two "
        "returned loans, one of them Circe returned late. Other members hold the remaining checked-out copies.",
        "insert_statements": [
            "INSERT INTO loans (id, copy_id, member_id, checked_out_at, due_at, returned_at, return_branch_id, renewals, status) VALUES (1, 4, 1, datetime('now', '-16 days'), datetime('now', '+5 days'), NULL, NULL, 0, 'active');",
            "INSERT INTO loans (id, copy_id, member_id, checked_out_at, due_at, returned_at, return_branch_id, renewals, status) VALUES (2, 6, 1, datetime('now', '-12 days'), datetime('now', '+9 days'), NULL, NULL, 0, 'active');",
            "INSERT INTO loans (id, copy_id, member_id, checked_out_at, due_at, returned_at, return_branch_id, renewals, status) VALUES (3, 12, 1, datetime('now', '-10 days'), datetime('now', '+11 days'), NULL, NULL, 0, 'active');",
            "INSERT INTO loans (id, copy_id, member_id, checked_out_at, due_at, returned_at, return_branch_id, renewals, status) VALUES (4, 13, 1, datetime('now', '-2 hours'), datetime('now', '+21 days', '-2 hours'), NULL, NULL, 0, 'active');",
            "INSERT INTO loans (id, copy_id, member_id, checked_out_at, due_at, returned_at, return_branch_id, renewals, status) VALUES (5, 20, 1, datetime('now', '-33 days'), datetime('now', '+2 days'), NULL, NULL, 1, 'active');",
            "INSERT INTO loans (id, copy_id, member_id, checked_out_at, due_at, returned_at, return_branch_id, renewals, status) VALUES (6, 11, 1, datetime('now', '-40 days'), datetime('now', '-19 days'), datetime('now', '-12 days'), 1, 0, 'returned');",
            "INSERT INTO loans (id, copy_id, member_id, checked_out_at, due_at, returned_at, return_branch_id, renewals, status) VALUES (7, 19, 1, datetime('now', '-90 days'), datetime('now', '-69 days'), datetime('now', '-75 days'), 4, 0, 'returned');",
            "INSERT INTO loans (id, copy_id, member_id, checked_out_at, due_at, returned_at, return_branch_id, renewals, status) VALUES (8, 2, 2, datetime('now', '-5 days'), datetime('now', '+16 days'), NULL, NULL, 0, 'active');",
            "INSERT INTO loans (id, copy_id, member_id, checked_out_at, due_at, returned_at, return_branch_id, renewals, status) VALUES (9, 7, 3, datetime('now', '-8 days'), datetime('now', '+13 days'), NULL, NULL, 0, 'active');",
            "INSERT INTO loans (id, copy_id, member_id, checked_out_at, due_at, returned_at, return_branch_id, renewals, status) VALUES (10, 8, 4, datetime('now', '-3 days'), datetime('now', '+18 days'), NULL, NULL, 0, 'active');",
            "INSERT INTO loans (id, copy_id, member_id, checked_out_at, due_at, returned_at, return_branch_id, renewals, status) VALUES (11, 9, 2, datetime('now', '-14 days'), datetime('now', '+7 days'), NULL, NULL, 0, 'active');",
            "INSERT INTO loans (id, copy_id, member_id, checked_out_at, due_at, returned_at, return_branch_id, renewals, status) VALUES (12, 10, 4, datetime('now', '-20 days'), datetime('now', '+1 days'), NULL, NULL, 0, 'active');",
            "INSERT INTO loans (id, copy_id, member_id, checked_out_at, due_at, returned_at, return_branch_id, renewals, status) VALUES (13, 16, 3, datetime('now', '-6 days'), datetime('now', '+15 days'), NULL, NULL, 0, 'active');",
        ],
    },
    {
        "table_name": "holds",
        "reasoning": "Member 1's hold on Dune was placed yesterday with the wrong pickup branch (Central) behind "
        "Marcus Webb's earlier hold; Priya Nair waits for The Midnight Library, which blocks renewing that "
        "loan; member 1 also has an old cancelled hold.",
        "insert_statements": [
            "INSERT INTO holds (id, book_id, member_id, pickup_branch_id, status, placed_at, expires_at, notes) VALUES (1, 5, 1, 1, 'waiting', datetime('now', '-1 days'), NULL, NULL);",
            "INSERT INTO holds (id, book_id, member_id, pickup_branch_id, status, placed_at, expires_at, notes) VALUES (2, 5, 3, 2, 'waiting', datetime('now', '-3 days'), NULL, 'Book club pick');",
            "INSERT INTO holds (id, book_id, member_id, pickup_branch_id, status, placed_at, expires_at, notes) VALUES (3, 6, 1, 1, 'cancelled', datetime('now', '-50 days'), NULL, NULL);",
            "INSERT INTO holds (id, book_id, member_id, pickup_branch_id, status, placed_at, expires_at, notes) VALUES (4, 10, 2, 2, 'waiting', datetime('now', '-4 days'), NULL, NULL);",
            "INSERT INTO holds (id, book_id, member_id, pickup_branch_id, status, placed_at, expires_at, notes) VALUES (5, 4, 4, 3, 'waiting', datetime('now', '-2 days'), NULL, NULL);",
        ],
    },
    {
        "table_name": "fines",
        "reasoning": "Member 1 owes two unpaid fines (1.75 overdue on Circe, 3.00 damage on Braiding Sweetgrass) "
        "and has one paid and one waived fine, so unpaid and total sums differ.",
        "insert_statements": [
            "INSERT INTO fines (id, member_id, loan_id, amount, reason, status, issued_at, paid_at, payment_method) VALUES (1, 1, 6, 1.75, 'Overdue: returned 7 days late', 'unpaid', datetime('now', '-12 days'), NULL, NULL);",
            "INSERT INTO fines (id, member_id, loan_id, amount, reason, status, issued_at, paid_at, payment_method) VALUES (2, 1, 7, 3.00, 'Damage: water stain on dust jacket', 'unpaid', datetime('now', '-75 days'), NULL, NULL);",
            "INSERT INTO fines (id, member_id, loan_id, amount, reason, status, issued_at, paid_at, payment_method) VALUES (3, 1, NULL, 2.50, 'Overdue: interlibrary loan returned late', 'paid', datetime('now', '-200 days'), datetime('now', '-190 days'), 'cash');",
            "INSERT INTO fines (id, member_id, loan_id, amount, reason, status, issued_at, paid_at, payment_method) VALUES (4, 1, NULL, 1.00, 'Overdue: waived during amnesty week', 'waived', datetime('now', '-400 days'), NULL, NULL);",
            "INSERT INTO fines (id, member_id, loan_id, amount, reason, status, issued_at, paid_at, payment_method) VALUES (5, 2, NULL, 5.00, 'Lost hold-shelf slip replacement', 'unpaid', datetime('now', '-30 days'), NULL, NULL);",
        ],
    },
]

# A verifier: the kit's id-keyed table diffs and answer helpers, then one task's check().
_verifier = partial(verifier, ID_DIFF_PRELUDE)

TASKS = [
    {
        "task": "How many copies of 'The Left Hand of Darkness' are available to borrow right now at the "
        "Riverside Branch?",
        "task_type": "info_seeking",
        "repair": False,
        "verifier": _verifier('''
if not unchanged_except():
    return False
rows = fetch(initial_db_path,
             "SELECT COUNT(*) FROM copies c JOIN books b ON b.id = c.book_id "
             "JOIN branches br ON br.id = c.branch_id "
             "WHERE b.title = 'The Left Hand of Darkness' AND br.name = 'Riverside Branch' "
             "AND c.status = 'available'")
expected = rows[0][0]
text = answer_text()
if not text.strip():
    return False
return mentions_number(text, expected)
'''),
        "solution": {
            "calls": [
                {"tool": "search_books", "arguments": {"query": "The Left Hand of Darkness"}},
                {"tool": "get_book_details", "arguments": {"book_id": 8}},
            ],
            "final_answer": "There are 2 copies of 'The Left Hand of Darkness' available at the Riverside Branch.",
        },
        "wrong": {
            "calls": [
                {"tool": "search_books", "arguments": {"query": "The Left Hand of Darkness"}},
            ],
            "final_answer": "There are 4 copies of 'The Left Hand of Darkness' available to borrow.",
        },
    },
    {
        "task": "What is the total amount I currently owe in unpaid library fines?",
        "task_type": "info_seeking",
        "repair": False,
        "verifier": _verifier('''
if not unchanged_except():
    return False
rows = fetch(initial_db_path, "SELECT COALESCE(SUM(amount), 0) FROM fines WHERE member_id = 1 AND status = 'unpaid'")
expected = round(rows[0][0], 2)
text = answer_text().replace(",", "")
amounts = [float(m) for m in re.findall(r"(?<![\\d.])(\\d+\\.\\d{2})(?!\\d)", text)]
return any(abs(a - expected) < 0.001 for a in amounts)
'''),
        "solution": {
            "calls": [{"tool": "list_my_fines", "arguments": {"status": "unpaid"}}],
            "final_answer": "You currently owe $4.75 in unpaid fines.",
        },
        "wrong": {
            "calls": [{"tool": "list_my_fines", "arguments": {}}],
            "final_answer": "Your fines add up to $8.25.",
        },
    },
    {
        "task": "Which book that I currently have checked out is due back soonest? Answer with its title.",
        "task_type": "info_seeking",
        "repair": False,
        "verifier": _verifier('''
if not unchanged_except():
    return False
rows = fetch(initial_db_path,
             "SELECT b.title FROM loans l JOIN copies c ON c.id = l.copy_id JOIN books b ON b.id = c.book_id "
             "WHERE l.member_id = 1 AND l.status = 'active' ORDER BY l.due_at ASC, l.id ASC")
if not rows:
    return False
expected = rows[0][0].lower()
others = {r[0].lower() for r in rows[1:]} - {expected}
text = answer_text()
if expected not in text:
    return False
return not any(o in text for o in others)
'''),
        "solution": {
            "calls": [{"tool": "list_my_loans", "arguments": {"status": "active"}}],
            "final_answer": "'The Midnight Library' is the checked-out book due back soonest.",
        },
        "wrong": {
            "calls": [{"tool": "list_my_loans", "arguments": {}}],
            "final_answer": "'Circe' has the earliest due date.",
        },
    },
    {
        "task": "Check out the available copy of 'Project Hail Mary' that is on the shelf at the Central Library.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
rows = fetch(initial_db_path,
             "SELECT c.id FROM copies c JOIN books b ON b.id = c.book_id JOIN branches br ON br.id = c.branch_id "
             "WHERE b.title = 'Project Hail Mary' AND br.name = 'Central Library' AND c.status = 'available'")
if len(rows) != 1:
    return False
copy_id = rows[0][0]
if not unchanged_except("loans", "copies"):
    return False
_, loans, added, removed, changed = diff("loans")
if len(added) != 1 or removed or changed:
    return False
loan = loans[added[0]]
if loan["copy_id"] != copy_id or loan["member_id"] != 1:
    return False
if loan["status"] != "active" or loan["returned_at"] is not None or not loan["due_at"]:
    return False
before, after, c_added, c_removed, c_changed = diff("copies")
if c_added or c_removed or c_changed != [copy_id]:
    return False
return after[copy_id]["status"] == "on_loan" and after[copy_id]["branch_id"] == before[copy_id]["branch_id"]
'''),
        "solution": {
            "calls": [
                {"tool": "search_books", "arguments": {"query": "Project Hail Mary"}},
                {"tool": "get_book_details", "arguments": {"book_id": 1}},
                {"tool": "checkout_copy", "arguments": {"copy_id": 1}},
            ],
            "final_answer": "Checked out copy LIB-000101 of 'Project Hail Mary' from the Central Library; it is due "
            "in 21 days.",
        },
        "wrong": {
            "calls": [
                {"tool": "search_books", "arguments": {"query": "Project Hail Mary"}},
                {"tool": "get_book_details", "arguments": {"book_id": 1}},
                {"tool": "checkout_copy", "arguments": {"copy_id": 3}},
            ],
            "final_answer": "Checked out 'Project Hail Mary'.",
        },
    },
    {
        "task": "Renew my loan of 'Piranesi' for 14 more days.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
rows = fetch(initial_db_path,
             "SELECT l.id FROM loans l JOIN copies c ON c.id = l.copy_id JOIN books b ON b.id = c.book_id "
             "WHERE b.title = 'Piranesi' AND l.member_id = 1 AND l.status = 'active'")
if len(rows) != 1:
    return False
loan_id = rows[0][0]
if not unchanged_except("loans"):
    return False
before, after, added, removed, changed = diff("loans")
if added or removed or changed != [loan_id]:
    return False
old, new = before[loan_id], after[loan_id]
if new["status"] != "active" or new["renewals"] != old["renewals"] + 1:
    return False
if new["copy_id"] != old["copy_id"] or new["checked_out_at"] != old["checked_out_at"]:
    return False
conn = sqlite3.connect(":memory:")
try:
    days = conn.execute("SELECT julianday(?) - julianday(?)", (new["due_at"], old["due_at"])).fetchone()[0]
finally:
    conn.close()
return days is not None and abs(days - 14) < 0.01
'''),
        "solution": {
            "calls": [
                {"tool": "list_my_loans", "arguments": {"status": "active"}},
                {"tool": "renew_loan", "arguments": {"loan_id": 1, "days": 14}},
            ],
            "final_answer": "Your loan of 'Piranesi' has been renewed for 14 more days.",
        },
        "wrong": {
            "calls": [
                {"tool": "list_my_loans", "arguments": {"status": "active"}},
                {"tool": "renew_loan", "arguments": {"loan_id": 2, "days": 14}},
            ],
            "final_answer": "Renewed for 14 days.",
        },
    },
    {
        "task": "Return my copy of 'The Overstory'; I am dropping it off at the Riverside Branch.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
rows = fetch(initial_db_path,
             "SELECT l.id, l.copy_id FROM loans l JOIN copies c ON c.id = l.copy_id "
             "JOIN books b ON b.id = c.book_id "
             "WHERE b.title = 'The Overstory' AND l.member_id = 1 AND l.status = 'active'")
branch = fetch(initial_db_path, "SELECT id FROM branches WHERE name = 'Riverside Branch'")
if len(rows) != 1 or len(branch) != 1:
    return False
loan_id, copy_id = rows[0]
branch_id = branch[0][0]
if not unchanged_except("loans", "copies"):
    return False
_, loans, added, removed, changed = diff("loans")
if added or removed or changed != [loan_id]:
    return False
loan = loans[loan_id]
if loan["status"] != "returned" or loan["returned_at"] is None or loan["return_branch_id"] != branch_id:
    return False
_, copies, c_added, c_removed, c_changed = diff("copies")
if c_added or c_removed or c_changed != [copy_id]:
    return False
return copies[copy_id]["status"] == "available" and copies[copy_id]["branch_id"] == branch_id
'''),
        "solution": {
            "calls": [
                {"tool": "list_my_loans", "arguments": {"status": "active"}},
                {"tool": "list_branches", "arguments": {}},
                {"tool": "return_loan", "arguments": {"loan_id": 2, "return_branch_id": 2}},
            ],
            "final_answer": "'The Overstory' has been returned at the Riverside Branch.",
        },
        "wrong": {
            "calls": [
                {"tool": "list_my_loans", "arguments": {"status": "active"}},
                {"tool": "return_loan", "arguments": {"loan_id": 2, "return_branch_id": 1}},
            ],
            "final_answer": "'The Overstory' has been returned.",
        },
    },
    {
        "task": "Place a hold on 'Klara and the Sun' for pickup at the Eastside Branch.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
book = fetch(initial_db_path, "SELECT id FROM books WHERE title = 'Klara and the Sun'")
branch = fetch(initial_db_path, "SELECT id FROM branches WHERE name = 'Eastside Branch'")
if len(book) != 1 or len(branch) != 1:
    return False
if not unchanged_except("holds"):
    return False
_, holds, added, removed, changed = diff("holds")
if len(added) != 1 or removed or changed:
    return False
hold = holds[added[0]]
return (hold["member_id"] == 1 and hold["book_id"] == book[0][0]
        and hold["pickup_branch_id"] == branch[0][0] and hold["status"] == "waiting")
'''),
        "solution": {
            "calls": [
                {"tool": "search_books", "arguments": {"query": "Klara"}},
                {"tool": "list_branches", "arguments": {}},
                {"tool": "place_hold", "arguments": {"book_id": 4, "pickup_branch_id": 3}},
            ],
            "final_answer": "A hold on 'Klara and the Sun' has been placed for pickup at the Eastside Branch.",
        },
        "wrong": {
            "calls": [
                {"tool": "search_books", "arguments": {"query": "Klara"}},
                {"tool": "place_hold", "arguments": {"book_id": 4, "pickup_branch_id": 1}},
            ],
            "final_answer": "Hold placed on 'Klara and the Sun'.",
        },
    },
    {
        "task": "Pay the overdue fine from my late return of 'Circe' using my card.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
rows = fetch(initial_db_path,
             "SELECT f.id FROM fines f JOIN loans l ON l.id = f.loan_id JOIN copies c ON c.id = l.copy_id "
             "JOIN books b ON b.id = c.book_id "
             "WHERE b.title = 'Circe' AND f.member_id = 1 AND f.status = 'unpaid'")
if len(rows) != 1:
    return False
fine_id = rows[0][0]
if not unchanged_except("fines"):
    return False
before, after, added, removed, changed = diff("fines")
if added or removed or changed != [fine_id]:
    return False
old, new = before[fine_id], after[fine_id]
return (new["status"] == "paid" and new["payment_method"] == "card" and new["paid_at"] is not None
        and new["amount"] == old["amount"])
'''),
        "solution": {
            "calls": [
                {"tool": "list_my_fines", "arguments": {"status": "unpaid"}},
                {"tool": "pay_fine", "arguments": {"fine_id": 1, "payment_method": "card"}},
            ],
            "final_answer": "Paid the $1.75 overdue fine for 'Circe' by card.",
        },
        "wrong": {
            "calls": [
                {"tool": "list_my_fines", "arguments": {"status": "unpaid"}},
                {"tool": "pay_fine", "arguments": {"fine_id": 2, "payment_method": "card"}},
            ],
            "final_answer": "Paid the fine by card.",
        },
    },
    {
        "task": "The hold I placed yesterday on 'Dune' was set to pick up at the Central Library by mistake; "
        "switch it to the Riverside Branch without losing my place in the queue.",
        "task_type": "state_mutating",
        "repair": True,
        "verifier": _verifier('''
rows = fetch(initial_db_path,
             "SELECT h.id FROM holds h JOIN books b ON b.id = h.book_id "
             "WHERE b.title = 'Dune' AND h.member_id = 1 AND h.status = 'waiting'")
branch = fetch(initial_db_path, "SELECT id FROM branches WHERE name = 'Riverside Branch'")
if len(rows) != 1 or len(branch) != 1:
    return False
hold_id = rows[0][0]
if not unchanged_except("holds"):
    return False
before, after, added, removed, changed = diff("holds")
if added or removed or changed != [hold_id]:
    return False
old, new = before[hold_id], after[hold_id]
return (new["pickup_branch_id"] == branch[0][0] and new["status"] == "waiting"
        and new["placed_at"] == old["placed_at"] and new["book_id"] == old["book_id"]
        and new["member_id"] == 1)
'''),
        "solution": {
            "calls": [
                {"tool": "list_my_holds", "arguments": {"status": "waiting"}},
                {"tool": "list_branches", "arguments": {}},
                {"tool": "update_hold", "arguments": {"hold_id": 1, "pickup_branch_id": 2}},
            ],
            "final_answer": "Your hold on 'Dune' now has the Riverside Branch as its pickup location and keeps its "
            "place in the queue.",
        },
        "wrong": {
            "calls": [
                {"tool": "list_my_holds", "arguments": {}},
                {"tool": "cancel_hold", "arguments": {"hold_id": 1}},
                {"tool": "place_hold", "arguments": {"book_id": 5, "pickup_branch_id": 2}},
            ],
            "final_answer": "I cancelled the old hold and placed a new hold on 'Dune' at the Riverside Branch.",
        },
    },
    {
        "task": "This morning I accidentally checked out a second copy of 'Educated' although I already had one "
        "at home; return that newer duplicate loan at the Central Library and keep my original loan.",
        "task_type": "state_mutating",
        "repair": True,
        "verifier": _verifier('''
rows = fetch(initial_db_path,
             "SELECT l.id, l.copy_id FROM loans l JOIN copies c ON c.id = l.copy_id "
             "JOIN books b ON b.id = c.book_id "
             "WHERE b.title = 'Educated' AND l.member_id = 1 AND l.status = 'active' "
             "ORDER BY l.checked_out_at DESC, l.id DESC")
branch = fetch(initial_db_path, "SELECT id FROM branches WHERE name = 'Central Library'")
if len(rows) != 2 or len(branch) != 1:
    return False
loan_id, copy_id = rows[0]
branch_id = branch[0][0]
if not unchanged_except("loans", "copies"):
    return False
_, loans, added, removed, changed = diff("loans")
if added or removed or changed != [loan_id]:
    return False
loan = loans[loan_id]
if loan["status"] != "returned" or loan["returned_at"] is None or loan["return_branch_id"] != branch_id:
    return False
_, copies, c_added, c_removed, c_changed = diff("copies")
if c_added or c_removed or c_changed != [copy_id]:
    return False
return copies[copy_id]["status"] == "available" and copies[copy_id]["branch_id"] == branch_id
'''),
        "solution": {
            "calls": [
                {"tool": "list_my_loans", "arguments": {"status": "active"}},
                {"tool": "return_loan", "arguments": {"loan_id": 4, "return_branch_id": 1}},
            ],
            "final_answer": "Returned the duplicate 'Educated' loan (copy LIB-000702, checked out this morning) at "
            "the Central Library; your original loan is unchanged.",
        },
        "wrong": {
            "calls": [
                {"tool": "list_my_loans", "arguments": {"status": "active"}},
                {"tool": "return_loan", "arguments": {"loan_id": 3, "return_branch_id": 1}},
            ],
            "final_answer": "Returned one copy of 'Educated' at the Central Library.",
        },
    },
]

PROBES = [
    {"tool": "get_my_account", "arguments": {}},
    {"tool": "update_my_account", "arguments": {"email": "jordan.reyes@example.org", "home_branch_id": 2}},
    {"tool": "update_my_account", "arguments": {"email": "priya.nair@example.com"}},
    {"tool": "search_books", "arguments": {"genre": "Science Fiction", "limit": 5}},
    {"tool": "get_book_details", "arguments": {"book_id": 999}},
    {"tool": "checkout_copy", "arguments": {"copy_id": 2}},
    {"tool": "renew_loan", "arguments": {"loan_id": 5, "days": 14}},
    {"tool": "renew_loan", "arguments": {"loan_id": 1, "days": 60}},
    {"tool": "place_hold", "arguments": {"book_id": 5, "pickup_branch_id": 2}},
    {"tool": "update_hold", "arguments": {"hold_id": 1, "notes": "Please call when ready."}},
    {"tool": "cancel_hold", "arguments": {"hold_id": 3}},
    {"tool": "pay_fine", "arguments": {"fine_id": 1, "payment_method": "bitcoin"}},
    {"tool": "list_my_holds", "arguments": {}},
]

# Task families (awm.scenarios.families): the practice set's parameterised tasks, one instance per slot row.
_BOOK_SLOTS = "SELECT id AS book_id, title, author, genre, publication_year AS year FROM books ORDER BY id"
FAMILIES = [
    {
        "family": "book_author",
        "task_type": "info_seeking",
        "slots": _BOOK_SLOTS,
        "task": "Who is the author of '{title}'?",
        "verifier": _verifier,
        "check": 'return unchanged_except() and P["author"].lower() in answer_text()',
        "solution": {"calls": [{"tool": "search_books", "arguments": {"query": "{title}"}}],
                     "final_answer": "'{title}' is by {author}."},
    },
    {
        "family": "book_year",
        "task_type": "info_seeking",
        "slots": _BOOK_SLOTS,
        "task": "In what year was '{title}' published?",
        "verifier": _verifier,
        "check": 'return unchanged_except() and mentions_number(answer_text(), P["year"])',
        "solution": {"calls": [{"tool": "search_books", "arguments": {"query": "{title}"}}],
                     "final_answer": "'{title}' was published in {year}."},
    },
    {
        "family": "book_genre",
        "task_type": "info_seeking",
        "slots": _BOOK_SLOTS,
        "task": "Which genre is '{title}' filed under in the catalogue?",
        "verifier": _verifier,
        "check": 'return unchanged_except() and P["genre"].lower() in answer_text()',
        "solution": {"calls": [{"tool": "search_books", "arguments": {"query": "{title}"}}],
                     "final_answer": "'{title}' is filed under {genre}."},
    },
    {
        "family": "copies_available",
        "task_type": "info_seeking",
        "slots": "SELECT b.title, (SELECT COUNT(*) FROM copies c WHERE c.book_id = b.id AND c.status = 'available') "
                 "AS available FROM books b ORDER BY b.id",
        "task": "How many copies of '{title}' are available to borrow across all branches right now?",
        "verifier": _verifier,
        "check": 'return unchanged_except() and mentions_number(answer_text(), P["available"])',
        "solution": {"calls": [{"tool": "search_books", "arguments": {"query": "{title}"}}],
                     "final_answer": "{available} copies of '{title}' are available right now."},
    },
    {
        "family": "place_hold",
        "task_type": "state_mutating",
        # books member 1 holds nothing active on, paired with a pickup branch (diagonal walk, no cross product)
        "slots": "SELECT b.id AS book_id, b.title, br.id AS branch_id, br.name AS branch FROM books b "
                 "JOIN branches br ON br.id = 1 + (b.id % 4) WHERE NOT EXISTS (SELECT 1 FROM holds h WHERE "
                 "h.book_id = b.id AND h.member_id = 1 AND h.status = 'waiting') ORDER BY b.id",
        "task": "Place a hold on '{title}' for pickup at the {branch}.",
        "verifier": _verifier,
        "check": '''
if not unchanged_except("holds"):
    return False
_, after, added, removed, changed = diff("holds")
if len(added) != 1 or removed or changed:
    return False
hold = after[added[0]]
return (hold["book_id"] == P["book_id"] and hold["member_id"] == 1 and hold["pickup_branch_id"] == P["branch_id"]
        and hold["status"] == "waiting")
''',
        "solution": {"calls": [{"tool": "search_books", "arguments": {"query": "{title}"}},
                               {"tool": "list_branches", "arguments": {}},
                               {"tool": "place_hold", "arguments": {"book_id": "{book_id}",
                                                                    "pickup_branch_id": "{branch_id}"}}],
                     "final_answer": "Placed a hold on '{title}' for pickup at the {branch}."},
    },
    {
        "family": "home_branch",
        "task_type": "state_mutating",
        "slots": "SELECT b.id AS branch_id, b.name AS branch, (SELECT MIN(x.id) FROM branches x WHERE x.id <> b.id "
                 "AND x.id <> m.home_branch_id) AS wrong_branch_id FROM branches b JOIN members m ON m.id = 1 "
                 "WHERE b.id <> m.home_branch_id ORDER BY b.id",
        "task": "Make the {branch} my home branch.",
        "verifier": _verifier,
        "check": '''
if not unchanged_except("members"):
    return False
_, after, added, removed, changed = diff("members")
return not added and not removed and changed == [1] and after[1]["home_branch_id"] == P["branch_id"]
''',
        "solution": {"calls": [{"tool": "list_branches", "arguments": {}},
                               {"tool": "update_my_account", "arguments": {"home_branch_id": "{branch_id}"}}],
                     "final_answer": "Your home branch is now the {branch}."},
        "wrong": {"calls": [{"tool": "update_my_account", "arguments": {"home_branch_id": "{wrong_branch_id}"}}]},
    },
]
