#!/bin/bash
cd /app
sqlite3 /app/shop.db <<'SQL'
DROP VIEW IF EXISTS monthly_revenue;
CREATE VIEW monthly_revenue AS
SELECT substr(o.created_at, 1, 7) AS month,
       COUNT(DISTINCT o.id) AS orders,
       COALESCE(SUM(oi.quantity * p.price_cents), 0) AS revenue_cents
FROM orders o
LEFT JOIN order_items oi ON oi.order_id = o.id
LEFT JOIN products p ON p.id = oi.product_id
WHERE o.status IN ('paid', 'shipped')
  AND o.created_at >= '2024-01-01' AND o.created_at < '2025-01-01'
GROUP BY month
ORDER BY month;
SQL
sqlite3 -csv /app/shop.db "SELECT month, orders, printf('%.2f', revenue_cents / 100.0) FROM monthly_revenue ORDER BY month;" > /tmp/rows.csv
{ echo "month,orders,revenue"; cat /tmp/rows.csv; } > /app/monthly_revenue_2024.csv
cat /app/monthly_revenue_2024.csv
