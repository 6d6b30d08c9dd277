#!/bin/bash
# Builds /app/shop, a repository where one commit in the middle introduced a regression.
set -e
n=0
commit() { n=$((n + 1)); export GIT_AUTHOR_DATE="2024-04-0${n}T09:00:00Z" GIT_COMMITTER_DATE="2024-04-0${n}T09:00:00Z"; git add -A; git commit -q -m "$1"; }
git init -q -b main /app/shop
cd /app/shop
cat > pricing.py <<'PY'
TAX_RATE = 0.20


def net_to_gross(net):
    return round(net * (1 + TAX_RATE), 2)


def apply_discount(price, percent):
    return round(price * (100 - percent) / 100, 2)
PY
cat > check.sh <<'SH'
#!/bin/bash
# Quick regression check: prints PASS and exits 0 when pricing behaves.
python3 - <<'PY'
import sys
sys.path.insert(0, ".")
from pricing import net_to_gross, apply_discount
assert net_to_gross(100) == 120.0, net_to_gross(100)
assert apply_discount(200, 15) == 170.0, apply_discount(200, 15)
print("PASS")
PY
SH
printf '__pycache__/\n' > .gitignore
commit "Add pricing helpers and check script"
printf '# Shop\n\nPricing helpers.\n' > README.md
commit "Add README"
sed -i 's/return round(price \* (100 - percent) \/ 100, 2)/return round(price * (100 - percent) \/ 100.0, 2)/' pricing.py
printf '\n\ndef format_price(value):\n    return f"{value:.2f} EUR"\n' >> pricing.py
commit "Add format_price"
sed -i 's/(100 - percent)/(100 + percent)/' pricing.py
printf 'changelog: refactor discount maths\n' > CHANGES.txt
commit "Refactor discount maths"
printf '\n\ndef shipping_cost(weight_kg):\n    return 4.90 if weight_kg < 2 else 9.90\n' >> pricing.py
commit "Add shipping cost"
printf '# Shop\n\nPricing and shipping helpers.\n' > README.md
commit "Update README"
