-- Fails on every (l_returnflag, l_linestatus) that appears more than once.
select l_returnflag, l_linestatus, count(*) as occurrences
from {{ ref('q1_pricing_summary') }}
group by l_returnflag, l_linestatus
having count(*) > 1
