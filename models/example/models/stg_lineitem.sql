-- Level 1 of the example chain: a staging view over lineitem (net price per line). A view
-- holds no data: consistent_stream models that ref() it are maintained over lineitem itself.
{{ config(materialized='view') }}

select
    l_orderkey,
    l_linenumber,
    l_extendedprice * (1 - l_discount) as net_price,
    l_returnflag
from {{ source('tpch', 'lineitem') }}
