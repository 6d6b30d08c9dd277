"""Creates /app/shop.db with a fixed pseudo-random order history (runs at image build time)."""
import random
import sqlite3

random.seed(1234)
db = sqlite3.connect("/app/shop.db")
db.executescript("""
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, price_cents INTEGER NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT NOT NULL, created_at TEXT NOT NULL,
                     status TEXT NOT NULL CHECK (status IN ('paid', 'shipped', 'cancelled', 'refunded')));
CREATE TABLE order_items (order_id INTEGER NOT NULL REFERENCES orders(id),
                          product_id INTEGER NOT NULL REFERENCES products(id),
                          quantity INTEGER NOT NULL);
""")
products = [(1, "Keyboard", 4999), (2, "Mouse", 1999), (3, "Monitor", 18999), (4, "Cable", 499), (5, "Dock", 8950)]
db.executemany("INSERT INTO products VALUES (?, ?, ?)", products)
oid = 1
for month in range(1, 13):
    for _ in range(random.randint(4, 9)):
        year = 2024 if random.random() < 0.9 else 2023
        day = random.randint(1, 28)
        created = f"{year}-{month:02d}-{day:02d} {random.randint(0, 23):02d}:{random.randint(0, 59):02d}:00"
        status = random.choice(["paid", "shipped", "shipped", "cancelled", "refunded"])
        db.execute("INSERT INTO orders VALUES (?, ?, ?, ?)", (oid, f"cust{random.randint(1, 30)}", created, status))
        for pid in random.sample(range(1, 6), random.randint(1, 3)):
            db.execute("INSERT INTO order_items VALUES (?, ?, ?)", (oid, pid, random.randint(1, 4)))
        oid += 1
# an order with no items and a month with nothing but cancellations
db.execute("INSERT INTO orders VALUES (?, 'cust99', '2024-06-30 23:59:59', 'paid')", (oid,))
db.commit()
