DROP TABLE payments;
DROP TABLE stock_history;
DROP TABLE order_items;
DROP TABLE orders;
DROP TABLE products;
DROP TABLE customers;
