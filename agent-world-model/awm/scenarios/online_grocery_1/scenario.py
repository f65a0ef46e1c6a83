"""online_grocery_1: an online grocery shop (catalogue, cart, addresses, coupons, orders)."""

from __future__ import annotations

from functools import partial

from awm.scenarios.verifier_kit import (
    ANSWER,
    CLOSE,
    HAS_NUMBER,
    NORM,
    ONE,
    ROWS,
    TABLE_SORTED,
    UNCHANGED_TABLES,
    prelude,
    verifier,
)

NAME = "online_grocery_1"

DESCRIPTION = (
    "FreshCart is an online grocery store that delivers fresh food and household staples to customers' "
    "homes and offices in scheduled delivery slots. The catalogue is organised into categories such as "
    "Fruits & Vegetables, Dairy & Eggs, Bakery, Beverages and Pantry; every product has a brand, a pack "
    "size, a unit price, a stock level and flags telling whether it is certified organic and whether it "
    "is currently sold. The signed-in customer keeps a shopping cart with one line per product, can add "
    "products (adding to a product already in the cart increases its quantity), set a line to an exact "
    "quantity, remove lines or empty the cart. Customers save several delivery addresses, each with a "
    "short label such as Home or Office, and mark one of them as the default; addresses can be added or "
    "replaced. Promotional coupons give a percentage off the subtotal when the order reaches a minimum "
    "amount, and they may be inactive or expired. Checking out turns the whole cart into an order for a "
    "chosen address and delivery slot, applies an optional coupon, reserves stock and empties the cart. "
    "Orders move from placed to packed, out for delivery and delivered; an order that has not yet left "
    "the store can be cancelled with a reason, which puts its items back into stock. The environment "
    "simulates everyday shopping: comparing products and prices, checking coupons and past orders, "
    "editing the cart, maintaining addresses, checking out and cancelling, and repairing mistakes such "
    "as the wrong product variant in the cart or an address saved with a typo."
)

TABLES = [
    {
        "name": "users",
        "ddl": (
            "CREATE TABLE users (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    full_name TEXT NOT NULL,\n"
            "    email TEXT NOT NULL UNIQUE,\n"
            "    phone TEXT,\n"
            "    created_at DATETIME DEFAULT CURRENT_TIMESTAMP\n"
            ");"
        ),
        "indexes": [],
    },
    {
        "name": "categories",
        "ddl": (
            "CREATE TABLE categories (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    name TEXT NOT NULL UNIQUE,\n"
            "    description TEXT\n"
            ");"
        ),
        "indexes": [],
    },
    {
        "name": "products",
        "ddl": (
            "CREATE TABLE products (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    category_id INTEGER NOT NULL,\n"
            "    name TEXT NOT NULL,\n"
            "    brand TEXT,\n"
            "    unit TEXT NOT NULL,\n"
            "    price REAL NOT NULL CHECK (price >= 0),\n"
            "    stock_quantity INTEGER NOT NULL DEFAULT 0 CHECK (stock_quantity >= 0),\n"
            "    is_organic INTEGER NOT NULL DEFAULT 0 CHECK (is_organic IN (0, 1)),\n"
            "    is_active INTEGER NOT NULL DEFAULT 1 CHECK (is_active IN (0, 1)),\n"
            "    created_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    FOREIGN KEY (category_id) REFERENCES categories(id)\n"
            ");"
        ),
        "indexes": [
            "CREATE INDEX idx_products_category ON products(category_id);",
            "CREATE INDEX idx_products_name ON products(name);",
        ],
    },
    {
        "name": "addresses",
        "ddl": (
            "CREATE TABLE addresses (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    user_id INTEGER NOT NULL,\n"
            "    label TEXT NOT NULL,\n"
            "    street TEXT NOT NULL,\n"
            "    city TEXT NOT NULL,\n"
            "    postal_code TEXT NOT NULL,\n"
            "    is_default INTEGER NOT NULL DEFAULT 0 CHECK (is_default IN (0, 1)),\n"
            "    created_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    FOREIGN KEY (user_id) REFERENCES users(id) ON DELETE CASCADE\n"
            ");"
        ),
        "indexes": ["CREATE INDEX idx_addresses_user ON addresses(user_id);"],
    },
    {
        "name": "coupons",
        "ddl": (
            "CREATE TABLE coupons (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    code TEXT NOT NULL UNIQUE,\n"
            "    description TEXT,\n"
            "    discount_percent INTEGER NOT NULL CHECK (discount_percent BETWEEN 1 AND 100),\n"
            "    min_order_total REAL NOT NULL DEFAULT 0 CHECK (min_order_total >= 0),\n"
            "    is_active INTEGER NOT NULL DEFAULT 1 CHECK (is_active IN (0, 1)),\n"
            "    expires_at DATETIME\n"
            ");"
        ),
        "indexes": [],
    },
    {
        "name": "cart_items",
        "ddl": (
            "CREATE TABLE cart_items (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    user_id INTEGER NOT NULL,\n"
            "    product_id INTEGER NOT NULL,\n"
            "    quantity INTEGER NOT NULL CHECK (quantity > 0),\n"
            "    added_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    UNIQUE (user_id, product_id),\n"
            "    FOREIGN KEY (user_id) REFERENCES users(id) ON DELETE CASCADE,\n"
            "    FOREIGN KEY (product_id) REFERENCES products(id)\n"
            ");"
        ),
        "indexes": ["CREATE INDEX idx_cart_items_user ON cart_items(user_id);"],
    },
    {
        "name": "orders",
        "ddl": (
            "CREATE TABLE orders (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    user_id INTEGER NOT NULL,\n"
            "    address_id INTEGER NOT NULL,\n"
            "    coupon_id INTEGER,\n"
            "    status TEXT NOT NULL DEFAULT 'placed' CHECK (status IN ('placed', 'packed', 'out_for_delivery', "
            "'delivered', 'cancelled')),\n"
            "    delivery_slot TEXT NOT NULL,\n"
            "    subtotal REAL NOT NULL CHECK (subtotal >= 0),\n"
            "    discount REAL NOT NULL DEFAULT 0 CHECK (discount >= 0),\n"
            "    total REAL NOT NULL CHECK (total >= 0),\n"
            "    cancel_reason TEXT,\n"
            "    created_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    updated_at DATETIME DEFAULT CURRENT_TIMESTAMP,\n"
            "    FOREIGN KEY (user_id) REFERENCES users(id),\n"
            "    FOREIGN KEY (address_id) REFERENCES addresses(id),\n"
            "    FOREIGN KEY (coupon_id) REFERENCES coupons(id)\n"
            ");"
        ),
        "indexes": ["CREATE INDEX idx_orders_user_created ON orders(user_id, created_at);"],
    },
    {
        "name": "order_items",
        "ddl": (
            "CREATE TABLE order_items (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    order_id INTEGER NOT NULL,\n"
            "    product_id INTEGER NOT NULL,\n"
            "    quantity INTEGER NOT NULL CHECK (quantity > 0),\n"
            "    unit_price REAL NOT NULL CHECK (unit_price >= 0),\n"
            "    FOREIGN KEY (order_id) REFERENCES orders(id) ON DELETE CASCADE,\n"
            "    FOREIGN KEY (product_id) REFERENCES products(id)\n"
            ");"
        ),
        "indexes": ["CREATE INDEX idx_order_items_order ON order_items(order_id);"],
    },
]


def _products() -> list[str]:
    # id, category, name, brand, unit, price, stock, organic, active
    rows = [
        (1, 1, "Honeycrisp Apples", "Orchard Valley", "1 lb", 2.99, 120, 0, 1),
        (2, 1, "Organic Baby Spinach", "Green Leaf Farms", "5 oz bag", 3.79, 40, 1, 1),
        (3, 1, "Baby Spinach", "FreshPick", "10 oz bag", 2.49, 60, 0, 1),
        (4, 1, "Organic Bananas", "Tropico", "bunch", 1.89, 80, 1, 1),
        (5, 1, "Roma Tomatoes", "FreshPick", "1 lb", 1.69, 70, 0, 1),
        (6, 2, "Whole Milk", "Sunny Dairy", "1 gal", 3.99, 50, 0, 1),
        (7, 2, "Organic 2% Milk", "Meadow Pure", "half gal", 4.59, 30, 1, 1),
        (8, 2, "Greek Yogurt 1kg", "Olympus", "1 kg tub", 6.49, 25, 0, 1),
        (9, 2, "Greek Yogurt 500g", "Olympus", "500 g tub", 3.89, 35, 0, 1),
        (10, 2, "Organic Free-Range Eggs", "Happy Hen", "12 ct", 5.29, 40, 1, 1),
        (11, 2, "Cheddar Cheese Block", "Sunny Dairy", "8 oz", 3.49, 45, 0, 1),
        (12, 2, "Organic Salted Butter", "Meadow Pure", "8 oz", 4.19, 30, 1, 1),
        (13, 2, "Organic Kefir", "Meadow Pure", "32 oz", 2.99, 0, 1, 0),
        (14, 3, "Whole Wheat Sourdough Bread", "Stone Oven", "24 oz loaf", 5.49, 20, 0, 1),
        (15, 3, "Butter Croissants 4-Pack", "Stone Oven", "4 ct", 6.99, 15, 0, 1),
        (16, 4, "Sparkling Water 12-Pack", "Bubbly Springs", "12 x 12 oz", 5.99, 35, 0, 1),
        (17, 4, "Barista Oat Milk", "Oat Fields", "32 oz", 4.79, 28, 0, 1),
        (18, 4, "Cold Brew Coffee Concentrate", "Bean Street", "32 oz", 8.99, 18, 0, 1),
        (19, 5, "Organic Rolled Oats", "Harvest Mill", "42 oz", 5.99, 22, 1, 1),
        (20, 5, "Extra Virgin Olive Oil", "Costa Oliva", "500 ml", 9.49, 26, 0, 1),
    ]
    return [
        "INSERT INTO products (id, category_id, name, brand, unit, price, stock_quantity, is_organic, is_active, "
        f"created_at) VALUES ({i}, {c}, '{n}', '{b}', '{u}', {p}, {s}, {o}, {a}, datetime('now', '-{200 - i} days'));"
        for i, c, n, b, u, p, s, o, a in rows
    ]


def _cart() -> list[str]:
    rows = [(1, 1, 1, 2, 50), (2, 1, 8, 2, 40), (3, 1, 14, 1, 30), (4, 1, 20, 1, 26), (5, 1, 18, 1, 20),
            (6, 1, 16, 2, 15), (7, 2, 4, 3, 90)]
    return [
        "INSERT INTO cart_items (id, user_id, product_id, quantity, added_at) VALUES "
        f"({i}, {u}, {p}, {q}, datetime('now', '-{m} minutes'));"
        for i, u, p, q, m in rows
    ]


def _orders() -> list[str]:
    # id, user, address, coupon, status, slot, subtotal, discount, total, reason, age
    rows = [
        (1, 1, 1, None, "delivered", "Sun 08:00-10:00", 9.87, 0.0, 9.87, None, "-20 days"),
        (2, 1, 2, 3, "delivered", "Thu 17:00-19:00", 21.47, 1.07, 20.40, None, "-6 days"),
        (3, 1, 1, None, "placed", "Fri 18:00-20:00", 16.57, 0.0, 16.57, None, "-1 days"),
        (4, 1, 1, None, "placed", "Sat 08:00-10:00", 12.97, 0.0, 12.97, None, "-3 hours"),
        (5, 1, 1, None, "cancelled", "Mon 12:00-14:00", 5.07, 0.0, 5.07, "Found a better delivery slot", "-10 days"),
        (6, 2, 3, None, "delivered", "Wed 10:00-12:00", 3.78, 0.0, 3.78, None, "-2 days"),
    ]
    out = []
    for i, u, a, c, st, slot, sub, disc, tot, reason, age in rows:
        coupon = "NULL" if c is None else str(c)
        reason_sql = "NULL" if reason is None else f"'{reason}'"
        out.append(
            "INSERT INTO orders (id, user_id, address_id, coupon_id, status, delivery_slot, subtotal, discount, total, "
            f"cancel_reason, created_at, updated_at) VALUES ({i}, {u}, {a}, {coupon}, '{st}', '{slot}', {sub:.2f}, "
            f"{disc:.2f}, {tot:.2f}, {reason_sql}, datetime('now', '{age}'), datetime('now', '{age}', '+1 hours'));"
        )
    return out


def _order_items() -> list[str]:
    rows = [(1, 1, 6, 2, 3.99), (2, 1, 4, 1, 1.89), (3, 2, 20, 1, 9.49), (4, 2, 19, 2, 5.99),
            (5, 3, 17, 2, 4.79), (6, 3, 15, 1, 6.99), (7, 4, 16, 1, 5.99), (8, 4, 11, 2, 3.49),
            (9, 5, 5, 3, 1.69), (10, 6, 4, 2, 1.89)]
    return [
        "INSERT INTO order_items (id, order_id, product_id, quantity, unit_price) VALUES "
        f"({i}, {o}, {p}, {q}, {u});"
        for i, o, p, q, u in rows
    ]


SAMPLE = [
    {
        "table_name": "users",
        "reasoning": "The signed-in customer (id 1) first, plus two other customers whose carts and orders must "
                     "stay untouched.",
        "insert_statements": [
            "INSERT INTO users (id, full_name, email, phone, created_at) VALUES "
            "(1, 'Jordan Miles', 'jordan.miles@example.com', '+1-217-555-0142', datetime('now', '-300 days'));",
            "INSERT INTO users (id, full_name, email, phone, created_at) VALUES "
            "(2, 'Ava Brooks', 'ava.brooks@example.com', '+1-217-555-0178', datetime('now', '-120 days'));",
            "INSERT INTO users (id, full_name, email, phone, created_at) VALUES "
            "(3, 'Ken Ito', 'ken.ito@example.com', NULL, datetime('now', '-15 days'));",
        ],
    },
    {
        "table_name": "categories",
        "reasoning": "Five store aisles; Dairy & Eggs is the one the organic price question is about.",
        "insert_statements": [
            "INSERT INTO categories (id, name, description) VALUES (1, 'Fruits & Vegetables', 'Fresh produce.');",
            "INSERT INTO categories (id, name, description) VALUES (2, 'Dairy & Eggs', 'Milk, yogurt, cheese, "
            "butter and eggs.');",
            "INSERT INTO categories (id, name, description) VALUES (3, 'Bakery', 'Bread and pastries baked daily.');",
            "INSERT INTO categories (id, name, description) VALUES (4, 'Beverages', 'Water, coffee and plant "
            "milks.');",
            "INSERT INTO categories (id, name, description) VALUES (5, 'Pantry', 'Grains, oils and staples.');",
        ],
    },
    {
        "table_name": "products",
        "reasoning": "Catalogue with near-miss variants (Organic Baby Spinach vs Baby Spinach, Greek Yogurt 1kg vs "
                     "500g), a cheaper non-organic dairy item and an inactive organic one.",
        "insert_statements": _products(),
    },
    {
        "table_name": "addresses",
        "reasoning": "User 1 has Home (default, saved with a wrong postal code) and Office; user 2 has her own Home.",
        "insert_statements": [
            "INSERT INTO addresses (id, user_id, label, street, city, postal_code, is_default, created_at) VALUES "
            "(1, 1, 'Home', '12 Elm Street', 'Springfield', '62701', 1, datetime('now', '-300 days'));",
            "INSERT INTO addresses (id, user_id, label, street, city, postal_code, is_default, created_at) VALUES "
            "(2, 1, 'Office', '300 Market Plaza, Suite 5', 'Springfield', '62703', 0, datetime('now', '-90 days'));",
            "INSERT INTO addresses (id, user_id, label, street, city, postal_code, is_default, created_at) VALUES "
            "(3, 2, 'Home', '77 Oak Lane', 'Springfield', '62704', 1, datetime('now', '-120 days'));",
        ],
    },
    {
        "table_name": "coupons",
        "reasoning": "One valid coupon with a minimum the current cart reaches, one expired coupon and one small "
                     "welcome coupon used on a past order.",
        "insert_statements": [
            "INSERT INTO coupons (id, code, description, discount_percent, min_order_total, is_active, expires_at) "
            "VALUES (1, 'FRESH15', '15% off fresh groceries', 15, 40.0, 1, datetime('now', '+30 days'));",
            "INSERT INTO coupons (id, code, description, discount_percent, min_order_total, is_active, expires_at) "
            "VALUES (2, 'SPRING10', 'Spring sale', 10, 25.0, 0, datetime('now', '-5 days'));",
            "INSERT INTO coupons (id, code, description, discount_percent, min_order_total, is_active, expires_at) "
            "VALUES (3, 'WELCOME5', 'Welcome discount', 5, 0.0, 1, datetime('now', '+60 days'));",
        ],
    },
    {
        "table_name": "cart_items",
        "reasoning": "User 1's cart (subtotal 54.91, above the FRESH15 minimum) including the 1kg yogurt added by "
                     "mistake; user 2 has a cart of her own.",
        "insert_statements": _cart(),
    },
    {
        "table_name": "orders",
        "reasoning": "Two delivered orders of user 1 (the newer one used a coupon), two still placed, one cancelled, "
                     "and a delivered order of user 2.",
        "insert_statements": _orders(),
    },
    {
        "table_name": "order_items",
        "reasoning": "Items matching each order's subtotal; the oat milk is in order 3 only.",
        "insert_statements": _order_items(),
    },
]

# Helpers of this shop's verifiers, beside the kit's.
_SHOP_HELPERS = '''
def product_id(name):
    return one(initial_db_path, "SELECT id FROM products WHERE name = ?", (name,))

def cart(path, user=1):
    found = rows(path, "SELECT product_id, quantity FROM cart_items WHERE user_id = ?", (user,))
    result = {}
    for pid, qty in found:
        result[pid] = result.get(pid, 0) + qty
    return result

def other_carts(path):
    return sorted(rows(path, "SELECT user_id, product_id, quantity FROM cart_items WHERE user_id != 1"))
'''

# A verifier: the kit's row helpers and this shop's, then one task's check(), which returns the verdict.
_verifier = partial(verifier, prelude(
    f"all_tables = {[t['name'] for t in TABLES]!r}",
    ROWS, ONE, TABLE_SORTED, UNCHANGED_TABLES, _SHOP_HELPERS, ANSWER, NORM, HAS_NUMBER, CLOSE,
    imports=("json", "re", "sqlite3")), check_returns_verdict=True)


def _call(tool: str, **arguments) -> dict:
    return {"tool": tool, "arguments": arguments}


TASKS = [
    {
        "task": "Which organic product that is currently sold in the 'Dairy & Eggs' category is the cheapest, and "
                "what is its price?",
        "task_type": "info_seeking",
        "repair": False,
        "verifier": _verifier('''
            cat = one(initial_db_path, "SELECT id FROM categories WHERE name = ?", ("Dairy & Eggs",))
            if cat is None:
                return {"result": "others"}
            cands = rows(initial_db_path,
                         "SELECT name, price FROM products WHERE category_id = ? AND is_organic = 1 "
                         "AND is_active = 1 ORDER BY price, id", (cat,))
            if not cands or (len(cands) > 1 and abs(cands[1][1] - cands[0][1]) < 0.005):
                return {"result": "others"}
            name, price = cands[0]
            if not unchanged(*all_tables):
                return {"result": "others"}
            if name.lower() not in answer() or not has_number(price):
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [
                _call("list_categories"),
                _call("search_products", category_id=2, organic_only=True),
            ],
            "final_answer": "The cheapest organic Dairy & Eggs product is Organic Salted Butter at $4.19.",
        },
        "wrong": {
            "calls": [
                _call("list_categories"),
                _call("search_products", category_id=2),
            ],
            "final_answer": "Cheddar Cheese Block, $3.49.",
        },
    },
    {
        "task": "How much did I pay in total for my most recent delivered order?",
        "task_type": "info_seeking",
        "repair": False,
        "verifier": _verifier('''
            found = rows(initial_db_path,
                         "SELECT total FROM orders WHERE user_id = 1 AND status = 'delivered' "
                         "ORDER BY created_at DESC, id DESC LIMIT 1")
            if not found:
                return {"result": "others"}
            total = found[0][0]
            if not unchanged(*all_tables):
                return {"result": "others"}
            if not has_number(total):
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [
                _call("list_orders", status="delivered"),
                _call("get_order_details", order_id=2),
            ],
            "final_answer": "Your most recent delivered order (#2) cost $20.40 after the WELCOME5 discount.",
        },
        "wrong": {
            "calls": [
                _call("list_orders"),
                _call("get_order_details", order_id=4),
            ],
            "final_answer": "You paid $12.97.",
        },
    },
    {
        "task": "What discount percentage does the coupon 'FRESH15' give, and what minimum order total does it require?",
        "task_type": "info_seeking",
        "repair": False,
        "verifier": _verifier('''
            found = rows(initial_db_path, "SELECT discount_percent, min_order_total FROM coupons WHERE code = ?",
                         ("FRESH15",))
            if len(found) != 1:
                return {"result": "others"}
            percent, minimum = found[0]
            if not unchanged(*all_tables):
                return {"result": "others"}
            if not has_number(percent) or not has_number(minimum):
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [_call("get_coupon", code="FRESH15")],
            "final_answer": "FRESH15 gives 15% off and requires a minimum order total of $40.00.",
        },
        "wrong": {
            "calls": [_call("get_coupon", code="SPRING10")],
            "final_answer": "It gives 10% off orders of at least $25.",
        },
    },
    {
        "task": "Add 3 bags of 'Organic Baby Spinach' to my cart.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
            pid = product_id("Organic Baby Spinach")
            if pid is None:
                return {"result": "others"}
            before, after = cart(initial_db_path), cart(final_db_path)
            expected = dict(before)
            expected[pid] = before.get(pid, 0) + 3
            if after != expected or other_carts(initial_db_path) != other_carts(final_db_path):
                return {"result": "others"}
            if not unchanged("users", "products", "addresses", "coupons", "orders", "order_items"):
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [
                _call("search_products", query="spinach"),
                _call("add_to_cart", product_id=2, quantity=3),
            ],
            "final_answer": "Added 3 x Organic Baby Spinach to your cart.",
        },
        "wrong": {
            "calls": [
                _call("search_products", query="baby spinach"),
                _call("add_to_cart", product_id=3, quantity=3),
            ],
            "final_answer": "Added 3 bags of baby spinach.",
        },
    },
    {
        "task": "Change the quantity of 'Honeycrisp Apples' in my cart to 6.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
            pid = product_id("Honeycrisp Apples")
            before, after = cart(initial_db_path), cart(final_db_path)
            if pid is None or pid not in before or before[pid] == 6:
                return {"result": "others"}
            expected = dict(before)
            expected[pid] = 6
            if after != expected or other_carts(initial_db_path) != other_carts(final_db_path):
                return {"result": "others"}
            if not unchanged("users", "products", "addresses", "coupons", "orders", "order_items"):
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [
                _call("get_cart"),
                _call("update_cart_item", item_id=1, quantity=6),
            ],
            "final_answer": "Your cart now has 6 Honeycrisp Apples.",
        },
        "wrong": {
            "calls": [
                _call("search_products", query="Honeycrisp"),
                _call("add_to_cart", product_id=1, quantity=6),
            ],
            "final_answer": "Added 6 Honeycrisp Apples.",
        },
    },
    {
        "task": "Check out my whole cart to my 'Office' address for the 'Sat 10:00-12:00' delivery slot using the "
                "coupon 'FRESH15'.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
            office = one(initial_db_path, "SELECT id FROM addresses WHERE user_id = 1 AND label = ?", ("Office",))
            coupon = rows(initial_db_path, "SELECT id, discount_percent FROM coupons WHERE code = ?", ("FRESH15",))
            items = cart(initial_db_path)
            if office is None or len(coupon) != 1 or not items:
                return {"result": "others"}
            coupon_id, percent = coupon[0]
            cols = "id, user_id, address_id, coupon_id, status, delivery_slot, subtotal, discount, total"
            old = {r[0]: r for r in rows(initial_db_path, "SELECT * FROM orders")}
            new = {r[0]: r for r in rows(final_db_path, "SELECT * FROM orders")}
            if any(new.get(k) != v for k, v in old.items()):
                return {"result": "others"}
            added = [k for k in new if k not in old]
            if len(added) != 1:
                return {"result": "others"}
            order = rows(final_db_path, f"SELECT {cols} FROM orders WHERE id = ?", (added[0],))[0]
            oid, user, address, used_coupon, status, slot, subtotal, discount, total = order
            if user != 1 or address != office or used_coupon != coupon_id or status != "placed":
                return {"result": "others"}
            if re.sub(r"\\s+", "", str(slot)).lower() != "sat10:00-12:00":
                return {"result": "others"}
            prices = {r[0]: r[1] for r in rows(initial_db_path, "SELECT id, price FROM products")}
            lines = rows(final_db_path, "SELECT product_id, quantity, unit_price FROM order_items WHERE order_id = ?",
                         (oid,))
            ordered = {}
            for pid, qty, unit_price in lines:
                if not close(unit_price, prices.get(pid)):
                    return {"result": "others"}
                ordered[pid] = ordered.get(pid, 0) + qty
            if ordered != items:
                return {"result": "others"}
            expected_subtotal = round(sum(prices[p] * q for p, q in items.items()), 2)
            expected_discount = round(expected_subtotal * percent / 100.0, 2)
            if not close(subtotal, expected_subtotal) or not close(discount, expected_discount):
                return {"result": "others"}
            if not close(total, expected_subtotal - expected_discount):
                return {"result": "others"}
            old_items = sorted(rows(initial_db_path, "SELECT * FROM order_items"))
            kept = sorted(r for r in rows(final_db_path, "SELECT * FROM order_items") if r[1] != oid)
            if old_items != kept:
                return {"result": "others"}
            if cart(final_db_path) or other_carts(initial_db_path) != other_carts(final_db_path):
                return {"result": "others"}
            stock_before = {r[0]: r for r in rows(initial_db_path, "SELECT * FROM products")}
            stock_after = {r[0]: r for r in rows(final_db_path, "SELECT * FROM products")}
            if set(stock_before) != set(stock_after):
                return {"result": "others"}
            for pid, row in stock_before.items():
                expected = row[:6] + (row[6] - items.get(pid, 0),) + row[7:]
                if stock_after[pid] != expected:
                    return {"result": "others"}
            if not unchanged("users", "categories", "addresses", "coupons"):
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [
                _call("get_cart"),
                _call("list_addresses"),
                _call("get_coupon", code="FRESH15"),
                _call("place_order", address_id=2, delivery_slot="Sat 10:00-12:00", coupon_code="FRESH15"),
            ],
            "final_answer": "Order placed to your Office address for Sat 10:00-12:00 with FRESH15: "
                            "subtotal $54.91, discount $8.24, total $46.67.",
        },
        "wrong": {
            "calls": [
                _call("get_cart"),
                _call("place_order", address_id=1, delivery_slot="Sat 10:00-12:00", coupon_code="FRESH15"),
            ],
            "final_answer": "Order placed with FRESH15 for Sat 10:00-12:00.",
        },
    },
    {
        "task": "Cancel my order that contains 'Barista Oat Milk' and has not been delivered yet, giving the reason "
                "'Ordered by mistake'.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
            pid = product_id("Barista Oat Milk")
            targets = rows(initial_db_path,
                           "SELECT DISTINCT o.id FROM orders o JOIN order_items oi ON oi.order_id = o.id "
                           "WHERE o.user_id = 1 AND o.status IN ('placed', 'packed') AND oi.product_id = ?", (pid,))
            if len(targets) != 1:
                return {"result": "others"}
            target = targets[0][0]
            cols = "id, user_id, address_id, coupon_id, status, delivery_slot, subtotal, discount, total, cancel_reason"
            old = {r[0]: r for r in rows(initial_db_path, f"SELECT {cols}, created_at FROM orders")}
            new = {r[0]: r for r in rows(final_db_path, f"SELECT {cols}, created_at FROM orders")}
            if set(old) != set(new):
                return {"result": "others"}
            for k, row in old.items():
                if k == target:
                    got = new[k]
                    if got[4] != "cancelled" or norm(got[9]) != "ordered by mistake":
                        return {"result": "others"}
                    if got[:4] + got[5:9] + got[10:] != row[:4] + row[5:9] + row[10:]:
                        return {"result": "others"}
                elif new[k] != row:
                    return {"result": "others"}
            returned = {}
            for p, q in rows(initial_db_path, "SELECT product_id, quantity FROM order_items WHERE order_id = ?",
                             (target,)):
                returned[p] = returned.get(p, 0) + q
            before = {r[0]: r for r in rows(initial_db_path, "SELECT * FROM products")}
            after = {r[0]: r for r in rows(final_db_path, "SELECT * FROM products")}
            if set(before) != set(after):
                return {"result": "others"}
            for p, row in before.items():
                expected = row[:6] + (row[6] + returned.get(p, 0),) + row[7:]
                if after[p] != expected:
                    return {"result": "others"}
            if not unchanged("users", "categories", "addresses", "coupons", "cart_items", "order_items"):
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [
                _call("list_orders", status="placed"),
                _call("get_order_details", order_id=4),
                _call("get_order_details", order_id=3),
                _call("cancel_order", order_id=3, reason="Ordered by mistake"),
            ],
            "final_answer": "Cancelled order #3 (Barista Oat Milk, Butter Croissants) with the reason "
                            "'Ordered by mistake'.",
        },
        "wrong": {
            "calls": [
                _call("list_orders", status="placed"),
                _call("cancel_order", order_id=4, reason="Ordered by mistake"),
            ],
            "final_answer": "Cancelled your pending order.",
        },
    },
    {
        "task": "Save a new delivery address labelled 'Parents' at '48 Maple Avenue', 'Springfield', postal code "
                "'62702', and make it my default address.",
        "task_type": "state_mutating",
        "repair": False,
        "verifier": _verifier('''
            cols = "id, user_id, label, street, city, postal_code, is_default, created_at"
            old = {r[0]: r for r in rows(initial_db_path, f"SELECT {cols} FROM addresses")}
            new = {r[0]: r for r in rows(final_db_path, f"SELECT {cols} FROM addresses")}
            if not set(old) <= set(new):
                return {"result": "others"}
            for k, row in old.items():
                expected = row[:6] + (0,) + row[7:] if row[1] == 1 else row
                if new[k] != expected:
                    return {"result": "others"}
            added = [new[k] for k in new if k not in old]
            if len(added) != 1:
                return {"result": "others"}
            _, user, label, street, city, postal, is_default, _ = added[0]
            if user != 1 or norm(label) != "parents" or norm(street) != "48 maple avenue":
                return {"result": "others"}
            if norm(city) != "springfield" or norm(postal) != "62702" or is_default != 1:
                return {"result": "others"}
            if not unchanged("users", "products", "coupons", "cart_items", "orders", "order_items"):
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [
                _call("list_addresses"),
                _call("add_address", label="Parents", street="48 Maple Avenue", city="Springfield",
                      postal_code="62702", is_default=True),
            ],
            "final_answer": "Saved 'Parents' (48 Maple Avenue, Springfield 62702) as your default address.",
        },
        "wrong": {
            "calls": [
                _call("add_address", label="Parents", street="48 Maple Avenue", city="Springfield",
                      postal_code="62702"),
            ],
            "final_answer": "Saved the Parents address.",
        },
    },
    {
        "task": "I put 'Greek Yogurt 1kg' in my cart by mistake when I wanted 'Greek Yogurt 500g'; replace it with the "
                "500g one in the same quantity.",
        "task_type": "state_mutating",
        "repair": True,
        "verifier": _verifier('''
            big, small = product_id("Greek Yogurt 1kg"), product_id("Greek Yogurt 500g")
            before, after = cart(initial_db_path), cart(final_db_path)
            if big is None or small is None or big not in before or small in before:
                return {"result": "others"}
            expected = {p: q for p, q in before.items() if p != big}
            expected[small] = before[big]
            if after != expected or other_carts(initial_db_path) != other_carts(final_db_path):
                return {"result": "others"}
            if not unchanged("users", "products", "addresses", "coupons", "orders", "order_items"):
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [
                _call("get_cart"),
                _call("search_products", query="Greek Yogurt"),
                _call("remove_cart_item", item_id=2),
                _call("add_to_cart", product_id=9, quantity=2),
            ],
            "final_answer": "Replaced the 1kg Greek Yogurt with 2 x Greek Yogurt 500g.",
        },
        "wrong": {
            "calls": [
                _call("search_products", query="Greek Yogurt 500g"),
                _call("add_to_cart", product_id=9, quantity=2),
            ],
            "final_answer": "Added 2 x Greek Yogurt 500g.",
        },
    },
    {
        "task": "My 'Home' address was saved with postal code '62701' but the correct code is '62704'; fix it.",
        "task_type": "state_mutating",
        "repair": True,
        "verifier": _verifier('''
            home = one(initial_db_path, "SELECT id FROM addresses WHERE user_id = 1 AND label = ?", ("Home",))
            if home is None:
                return {"result": "others"}
            cols = "id, user_id, label, street, city, postal_code, is_default, created_at"
            old = {r[0]: r for r in rows(initial_db_path, f"SELECT {cols} FROM addresses")}
            new = {r[0]: r for r in rows(final_db_path, f"SELECT {cols} FROM addresses")}
            if set(old) != set(new) or old[home][5] != "62701":
                return {"result": "others"}
            for k, row in old.items():
                if k == home:
                    got = new[k]
                    if norm(got[5]) != "62704" or got[:5] != row[:5] or got[6:] != row[6:]:
                        return {"result": "others"}
                elif new[k] != row:
                    return {"result": "others"}
            if not unchanged("users", "products", "coupons", "cart_items", "orders", "order_items"):
                return {"result": "others"}
            return {"result": "complete"}
        '''),
        "solution": {
            "calls": [
                _call("list_addresses"),
                _call("update_address", address_id=1, label="Home", street="12 Elm Street", city="Springfield",
                      postal_code="62704", is_default=True),
            ],
            "final_answer": "Your Home address now has postal code 62704.",
        },
        "wrong": {
            "calls": [
                _call("list_addresses"),
                _call("add_address", label="Home", street="12 Elm Street", city="Springfield",
                      postal_code="62704", is_default=True),
            ],
            "final_answer": "Saved your Home address with postal code 62704.",
        },
    },
]

PROBES = [
    _call("get_product", product_id=13),
    _call("get_product", product_id=999),
    _call("add_to_cart", product_id=13, quantity=1),
    _call("update_cart_item", item_id=7, quantity=2),
    _call("get_coupon", code="NOPE"),
    _call("cancel_order", order_id=2, reason="Too late"),
    _call("get_order_details", order_id=6),
    _call("place_order", address_id=2, delivery_slot="Sun 08:00-10:00", coupon_code="SPRING10"),
    _call("clear_cart"),
    _call("place_order", address_id=2, delivery_slot="Sun 08:00-10:00"),
    _call("get_cart"),
]

# Task families (awm.scenarios.families): the practice set's parameterised tasks, one instance per slot row.
# Their check() bodies return the verdict dict, like the hand-written tasks' above.
_ACTIVE_PRODUCTS = ("SELECT id AS product_id, name, brand, printf('%.2f', price) AS price FROM products "
                    "WHERE is_active = 1")
_MY_CART_LINES = ("SELECT c.id AS item_id, p.id AS product_id, p.name, c.quantity + 2 AS qty, "
                  "c.quantity + 3 AS wrong_qty FROM cart_items c "
                  "JOIN products p ON p.id = c.product_id WHERE c.user_id = 1 ORDER BY c.id")
_INFO_CHECK = '''
if not unchanged(*all_tables):
    return {"result": "others"}
return {"result": "complete" if %s else "others"}
'''
# after the expected cart of user 1 is computed: the cart matches and nothing else changed
_CART_CHECK_TAIL = '''
if cart(final_db_path) != expected or other_carts(initial_db_path) != other_carts(final_db_path):
    return {"result": "others"}
if not unchanged("users", "categories", "products", "addresses", "coupons", "orders", "order_items"):
    return {"result": "others"}
return {"result": "complete"}
'''
FAMILIES = [
    {
        "family": "product_price",
        "task_type": "info_seeking",
        "slots": _ACTIVE_PRODUCTS + " ORDER BY id",
        "limit": 10,
        "task": "What is the current price of '{name}'?",
        "verifier": _verifier,
        "check": _INFO_CHECK % 'has_number(P["price"])',
        "solution": {"calls": [_call("search_products", query="{name}")],
                     "final_answer": "'{name}' currently costs ${price}."},
    },
    {
        "family": "product_brand",
        "task_type": "info_seeking",
        "slots": _ACTIVE_PRODUCTS + " ORDER BY name, id",
        "limit": 8,
        "task": "Which brand makes the '{name}' sold in the shop?",
        "verifier": _verifier,
        "check": _INFO_CHECK % 'P["brand"].lower() in answer()',
        "solution": {"calls": [_call("search_products", query="{name}")],
                     "final_answer": "'{name}' is made by {brand}."},
    },
    {
        "family": "category_cheapest",
        "task_type": "info_seeking",
        "slots": "SELECT c.id AS category_id, c.name AS category, p.name AS product, printf('%.2f', p.price) AS price "
                 "FROM categories c JOIN products p ON p.id = (SELECT id FROM products WHERE category_id = c.id "
                 "AND is_active = 1 ORDER BY price, id LIMIT 1) ORDER BY c.id",
        "task": "What is the cheapest product currently sold in the '{category}' category?",
        "verifier": _verifier,
        "check": _INFO_CHECK % 'P["product"].lower() in answer()',
        "solution": {"calls": [_call("list_categories"), _call("search_products", category_id="{category_id}")],
                     "final_answer": "The cheapest product in {category} is {product} at ${price}."},
    },
    {
        "family": "order_total_by_slot",
        "task_type": "info_seeking",
        "slots": "SELECT id AS order_id, delivery_slot AS slot, printf('%.2f', total) AS total FROM orders "
                 "WHERE user_id = 1 ORDER BY id",
        "task": "What was the total of my order for the '{slot}' delivery slot?",
        "verifier": _verifier,
        "check": _INFO_CHECK % 'has_number(P["total"])',
        "solution": {"calls": [_call("list_orders")],
                     "final_answer": "Your order for the {slot} delivery slot came to ${total}."},
    },
    {
        "family": "add_to_cart",
        "task_type": "state_mutating",
        # products on sale that are not in my cart yet, each with a quantity of 1 to 3
        "slots": "SELECT p.id AS product_id, p.name, 1 + p.id % 3 AS qty FROM products p WHERE p.is_active = 1 "
                 "AND NOT EXISTS (SELECT 1 FROM cart_items c WHERE c.user_id = 1 AND c.product_id = p.id) "
                 "ORDER BY p.id",
        "limit": 10,
        "task": "Put {qty} of '{name}' into my cart.",
        "verifier": _verifier,
        "check": '''
expected = cart(initial_db_path)
expected[P["product_id"]] = expected.get(P["product_id"], 0) + P["qty"]
''' + _CART_CHECK_TAIL,
        "solution": {"calls": [_call("search_products", query="{name}"),
                               _call("add_to_cart", product_id="{product_id}", quantity="{qty}")],
                     "final_answer": "Added {qty} x {name} to your cart."},
    },
    {
        "family": "set_cart_quantity",
        "task_type": "state_mutating",
        "slots": _MY_CART_LINES,
        "task": "Set the '{name}' line in my cart to a quantity of {qty}.",
        "verifier": _verifier,
        "check": '''
expected = cart(initial_db_path)
if P["product_id"] not in expected:
    return {"result": "others"}
expected[P["product_id"]] = P["qty"]
''' + _CART_CHECK_TAIL,
        "solution": {"calls": [_call("get_cart"), _call("update_cart_item", item_id="{item_id}", quantity="{qty}")],
                     "final_answer": "Your cart now has {qty} x {name}."},
        # a plausible slip the agent can see in the tool's result (the recovery testbed's damage)
        "wrong": {"calls": [_call("update_cart_item", item_id="{item_id}", quantity="{wrong_qty}")]},
    },
    {
        # two writes of the same tool in one plan: only in the recovery testbed (awm_grpo.recovery.testbed),
        # not in the practice set, whose task split and figures stay as they were
        "testbed_only": True,
        "family": "set_two_cart_quantities",
        "task_type": "state_mutating",
        "slots": "SELECT a.id AS item_id, pa.id AS product_id, pa.name, a.quantity + 2 AS qty, b.id AS item_id2, "
                 "pb.id AS product_id2, pb.name AS name2, b.quantity + 1 AS qty2 FROM cart_items a "
                 "JOIN cart_items b ON b.id = (SELECT MIN(id) FROM cart_items WHERE user_id = 1 AND id > a.id) "
                 "JOIN products pa ON pa.id = a.product_id JOIN products pb ON pb.id = b.product_id "
                 "WHERE a.user_id = 1 ORDER BY a.id",
        "task": "Set the '{name}' line in my cart to a quantity of {qty} and the '{name2}' line to {qty2}.",
        "verifier": _verifier,
        "check": '''
expected = cart(initial_db_path)
if P["product_id"] not in expected or P["product_id2"] not in expected:
    return {"result": "others"}
expected[P["product_id"]] = P["qty"]
expected[P["product_id2"]] = P["qty2"]
''' + _CART_CHECK_TAIL,
        "solution": {"calls": [_call("get_cart"), _call("update_cart_item", item_id="{item_id}", quantity="{qty}"),
                               _call("update_cart_item", item_id="{item_id2}", quantity="{qty2}")],
                     "final_answer": "Your cart now has {qty} x {name} and {qty2} x {name2}."},
    },
    {
        "family": "remove_from_cart",
        "task_type": "state_mutating",
        "slots": _MY_CART_LINES,
        "task": "Take '{name}' out of my cart.",
        "verifier": _verifier,
        "check": '''
expected = cart(initial_db_path)
if expected.pop(P["product_id"], None) is None:
    return {"result": "others"}
''' + _CART_CHECK_TAIL,
        "solution": {"calls": [_call("get_cart"), _call("remove_cart_item", item_id="{item_id}")],
                     "final_answer": "Removed {name} from your cart."},
    },
]
