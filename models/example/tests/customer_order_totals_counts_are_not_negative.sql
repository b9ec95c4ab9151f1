-- Fails on every customer whose order count is negative (a retraction applied twice).
select c_custkey, order_count
from {{ ref('customer_order_totals') }}
where order_count < 0
